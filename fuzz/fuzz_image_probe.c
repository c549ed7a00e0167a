/* libFuzzer harness: an image file as arbitrary bytes. tide__image_probe
 * reads only its header: it must refuse it (TIDE_EINVAL, with a reason) or
 * give a shape within TIDE_DATA_MAX_IMAGE_PIXELS and 1 or 3 channels. An
 * image it accepts with at most 64 K pixels is decoded too (libpng and
 * libjpeg under ASan, into an 8 x 8 sample: the resize path). */
#include <string.h>

#include "core/core.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int h = 0, w = 0, c = 0;
  char why[512] = "";
  int rc = tide__image_probe(data, size, &h, &w, &c, why, sizeof why);
  if (rc != 0) {
    if (rc != TIDE_EINVAL || why[0] == '\0') __builtin_trap();
    return 0;
  }
  int64_t cap = tide__param_int(TIDE__PARAM_DATA_MAX_IMAGE_PIXELS);
  if (h < 1 || w < 1 || (c != 1 && c != 3) || (int64_t)h * w > cap) __builtin_trap();
  if ((int64_t)h * w <= 65536) {
    uint8_t out[8 * 8 * 3];
    why[0] = '\0';
    rc = tide__image_decode(data, size, 8, 8, c, out, why, sizeof why);
    if (rc != 0 && (rc != TIDE_EINVAL || why[0] == '\0')) __builtin_trap();
  }
  return 0;
}
