/* PNG (libpng's simplified API) and JPEG (libjpeg-turbo) decoding into
 * uint8 HWC pixels, nearest-neighbour resizing, and PNG encoding for the
 * export tool. A damaged image is an error with the decoder's message; a
 * JPEG decoder warning (a truncated file: "Premature end of JPEG file") is
 * an error too, never a silently grey image. */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#include "data/data.h"

static int is_png(const uint8_t *d, size_t n) { return n >= 8 && png_sig_cmp(d, 0, 8) == 0; }
static int is_jpeg(const uint8_t *d, size_t n) { return n >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff; }

/* A header that claims more than TIDE_DATA_MAX_IMAGE_PIXELS is refused
 * before a byte is decoded: a small file can claim 20000 x 20000 pixels
 * (a decompression bomb), and decoding it would cost that much memory. */
static int too_many_pixels(const char *format, uint64_t h, uint64_t w, char *why, size_t cap) {
  uint64_t max = (uint64_t)tide__param_int(TIDE__PARAM_DATA_MAX_IMAGE_PIXELS);
  if (h * w <= max) return 0;
  snprintf(why, cap,
           "%s: its header claims %llux%llu = %llu pixels, more than TIDE_DATA_MAX_IMAGE_PIXELS=%llu; refused "
           "before decoding (a decompression bomb, or raise the bound)",
           format, (unsigned long long)h, (unsigned long long)w, (unsigned long long)(h * w), (unsigned long long)max);
  return 1;
}

/* ---- JPEG ------------------------------------------------------------------ */

typedef struct {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
} jpeg_error_t;

static void jpeg_fail(j_common_ptr cinfo) {
  jpeg_error_t *e = (jpeg_error_t *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

/* Warnings (level -1) are corrupt data: treat them as errors. */
static void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);
}

/* Decodes (or, when out is NULL, only probes) a JPEG. */
static int jpeg_read(const uint8_t *data, size_t len, int channels, uint8_t **out, int *h, int *w, int *c,
                     char *why, size_t cap) {
  struct jpeg_decompress_struct cinfo;
  jpeg_error_t err;
  uint8_t *volatile pixels = NULL;
  memset(&cinfo, 0, sizeof cinfo);
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    snprintf(why, cap, "JPEG: %s", err.message);
    jpeg_destroy_decompress(&cinfo);
    tide__free(pixels);
    return TIDE_EINVAL;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)len);
  jpeg_read_header(&cinfo, TRUE);
  *h = (int)cinfo.image_height;
  *w = (int)cinfo.image_width;
  *c = cinfo.num_components == 1 ? 1 : 3;
  if (too_many_pixels("JPEG", cinfo.image_height, cinfo.image_width, why, cap)) {
    jpeg_destroy_decompress(&cinfo);
    return TIDE_EINVAL;
  }
  if (out == NULL) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  size_t stride = (size_t)cinfo.output_width * (size_t)cinfo.output_components;
  pixels = tide__malloc(stride * cinfo.output_height);
  if (pixels == NULL) longjmp(err.jump, 1);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  *out = pixels;
  return 0;
}

/* ---- PNG ------------------------------------------------------------------- */

static int png_read(const uint8_t *data, size_t len, int channels, uint8_t **out, int *h, int *w, int *c, char *why,
                    size_t cap) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, len)) {
    snprintf(why, cap, "PNG: %s", img.message);
    png_image_free(&img);
    return TIDE_EINVAL;
  }
  *h = (int)img.height;
  *w = (int)img.width;
  *c = (img.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
  if (too_many_pixels("PNG", img.height, img.width, why, cap)) {
    png_image_free(&img);
    return TIDE_EINVAL;
  }
  if (out == NULL) {
    png_image_free(&img);
    return 0;
  }
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  uint8_t *pixels = tide__malloc(PNG_IMAGE_SIZE(img));
  if (pixels == NULL) {
    png_image_free(&img);
    return TIDE_ENOMEM;
  }
  if (!png_image_finish_read(&img, NULL, pixels, 0, NULL)) {
    snprintf(why, cap, "PNG: %s", img.message);
    png_image_free(&img);
    tide__free(pixels);
    return TIDE_EINVAL;
  }
  *out = pixels;
  return 0;
}

static int read_any(const uint8_t *data, size_t len, int channels, uint8_t **out, int *h, int *w, int *c, char *why,
                    size_t cap) {
  if (data == NULL || len == 0) {
    snprintf(why, cap, "empty file");
    return TIDE_EINVAL;
  }
  if (is_png(data, len)) return png_read(data, len, channels, out, h, w, c, why, cap);
  if (is_jpeg(data, len)) return jpeg_read(data, len, channels, out, h, w, c, why, cap);
  snprintf(why, cap, "neither PNG nor JPEG (first bytes %02x %02x %02x)", data[0], len > 1 ? data[1] : 0,
           len > 2 ? data[2] : 0);
  return TIDE_EINVAL;
}

int tide__image_probe(const uint8_t *data, size_t len, int *height, int *width, int *channels, char *why,
                      size_t cap) {
  char scratch[8];
  int h, w, c;
  if (why == NULL) why = scratch, cap = sizeof scratch;
  TIDE_CHECK(read_any(data, len, 3, NULL, &h, &w, &c, why, cap));
  *height = h;
  *width = w;
  *channels = c;
  return 0;
}

int tide__image_decode(const uint8_t *data, size_t len, int height, int width, int channels, uint8_t *out,
                       char *why, size_t cap) {
  uint8_t *pixels = NULL;
  int h, w, c;
  int rc = read_any(data, len, channels, &pixels, &h, &w, &c, why, cap);
  if (rc < 0) return rc;
  if (h == height && w == width) {
    memcpy(out, pixels, (size_t)height * (size_t)width * (size_t)channels);
  } else { /* nearest neighbour */
    for (int y = 0; y < height; y++) {
      const uint8_t *row = pixels + (size_t)((int64_t)y * h / height) * (size_t)w * (size_t)channels;
      for (int x = 0; x < width; x++)
        memcpy(out + ((size_t)y * (size_t)width + (size_t)x) * (size_t)channels,
               row + (size_t)((int64_t)x * w / width) * (size_t)channels, (size_t)channels);
    }
  }
  tide__free(pixels);
  return 0;
}

int tide__png_encode(const uint8_t *pixels, int height, int width, int channels, uint8_t **data, size_t *len) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)width;
  img.height = (png_uint_32)height;
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, NULL, &size, 0, pixels, 0, NULL)) {
    TIDE_ERROR("PNG encode: %s", img.message);
    return TIDE_EIO;
  }
  uint8_t *buf = tide__malloc(size);
  if (buf == NULL) return TIDE_ENOMEM;
  if (!png_image_write_to_memory(&img, buf, &size, 0, pixels, 0, NULL)) {
    TIDE_ERROR("PNG encode: %s", img.message);
    tide__free(buf);
    return TIDE_EIO;
  }
  *data = buf;
  *len = size;
  return 0;
}
