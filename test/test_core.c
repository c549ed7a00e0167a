/* Core pieces on their own: the error table, HMAC-SHA256 against RFC 4231,
 * the parameter table's validation, the allocator hook (and out-of-memory
 * paths), the reduction kernels and the block partition. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "core/simd.h"
#include "harness.h"
#include "transport/transport.h"

static void errors(void) {
  int codes[] = {TIDE_EINVAL, TIDE_ENOMEM, TIDE_EIO, TIDE_ETIMEDOUT, TIDE_ENOENT, TIDE_ECONNREFUSED,
                 TIDE_ENOSYS, TIDE_EPEER, TIDE_EMISMATCH, TIDE_EABORTED, TIDE_EAUTH, TIDE_EPROTO, TIDE_ESTATE};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    CHECK(codes[i] < 0);
    CHECK(strcmp(tide_strerror(codes[i]), "unknown error") != 0);
    CHECK(strncmp(tide_err_name(codes[i]), "TIDE_E", 6) == 0);
    for (size_t j = 0; j < i; j++) CHECK(codes[i] != codes[j]);
  }
  CHECK(strcmp(tide_err_name(TIDE_EPEER), "TIDE_EPEER") == 0);
  CHECK(strcmp(tide_strerror(0), "success") == 0);
  CHECK(strcmp(tide_strerror(-424242), "unknown error") == 0);
}

static void hex(const uint8_t *d, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void hmac(void) {
  uint8_t out[32];
  char text[65];
  tide__sha256("abc", 3, out);
  hex(out, 32, text);
  CHECK(strcmp(text, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
  /* RFC 4231 test cases 1 and 2 */
  uint8_t key1[20];
  memset(key1, 0x0b, sizeof key1);
  tide__hmac_sha256(key1, 20, "Hi There", 8, out);
  hex(out, 32, text);
  CHECK(strcmp(text, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7") == 0);
  tide__hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, out);
  hex(out, 32, text);
  CHECK(strcmp(text, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843") == 0);
  /* test case 6: a key longer than the block */
  uint8_t key6[131];
  memset(key6, 0xaa, sizeof key6);
  const char *msg6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  tide__hmac_sha256(key6, sizeof key6, msg6, strlen(msg6), out);
  hex(out, 32, text);
  CHECK(strcmp(text, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54") == 0);
}

static size_t allocations;
static int fail_after = -1;
static void *counting_malloc(size_t n) {
  allocations++;
  if (fail_after >= 0 && (int)allocations > fail_after) return NULL;
  return malloc(n);
}
static void *counting_realloc(void *p, size_t n) {
  allocations++;
  if (fail_after >= 0 && (int)allocations > fail_after) return NULL;
  return realloc(p, n);
}
static void *counting_calloc(size_t a, size_t b) {
  allocations++;
  if (fail_after >= 0 && (int)allocations > fail_after) return NULL;
  return calloc(a, b);
}

static void allocator(void) {
  CHECK_RC(tide_replace_allocator(NULL, realloc, calloc, free), TIDE_EINVAL);
  CHECK_OK(tide_replace_allocator(counting_malloc, counting_realloc, counting_calloc, free));
  /* a one-rank communicator allocates through the hook */
  unsetenv("TIDE_RDZV");
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  CHECK(allocations > 0);
  float x[3] = {1, 2, 3}, y[3];
  CHECK_OK(tide_allreduce(comm, x, y, 3, TIDE_F32, TIDE_AVG));
  CHECK(y[0] == 1 && y[2] == 3);
  tide_comm_destroy(comm);
  /* every allocation of init failing in turn: init fails cleanly with
   * ENOMEM and writes no communicator */
  allocations = 0;
  CHECK_OK(tide_comm_init(&comm));
  size_t needed = allocations;
  tide_comm_destroy(comm);
  CHECK(needed > 0);
  for (size_t k = 0; k < needed; k++) {
    allocations = 0;
    fail_after = (int)k;
    comm = NULL;
    int rc = tide_comm_init(&comm);
    fail_after = -1;
    if (rc != TIDE_ENOMEM || comm != NULL) {
      fprintf(stderr, "allocation %zu of %zu failing: tide_comm_init returned %s, comm %p\n", k + 1, needed,
              tide_err_name(rc), (void *)comm);
      exit(1);
    }
  }
  CHECK_OK(tide_replace_allocator(malloc, realloc, calloc, free));
}

static void kernels(void) {
  float a[5] = {1, -2, 3.5f, 0, 7}, b[5] = {2, 2, -1, 0, -7}, d[5];
  tide__reduce(d, a, b, 5, TIDE_F32, TIDE_SUM);
  CHECK(d[0] == 3 && d[1] == 0 && d[2] == 2.5f && d[4] == 0);
  tide__reduce(d, a, b, 5, TIDE_F32, TIDE_MIN);
  CHECK(d[1] == -2 && d[4] == -7);
  tide__reduce(d, a, b, 5, TIDE_F32, TIDE_MAX);
  CHECK(d[0] == 2 && d[2] == 3.5f);
  int64_t i[2] = {1LL << 40, -5}, j[2] = {1, 5}, k[2];
  tide__reduce(k, i, j, 2, TIDE_I64, TIDE_SUM);
  CHECK(k[0] == (1LL << 40) + 1 && k[1] == 0);
  tide__scale(k, 2, TIDE_I64, 2);
  CHECK(k[0] == ((1LL << 40) + 1) / 2);
  /* f16: 1.5 + 2.25 = 3.75 (0x3c00 = 1.0, 0x3e00 = 1.5, 0x4080 = 2.25, 0x4380 = 3.75) */
  uint16_t h1[3] = {0x3e00, 0x3c00, 0x7bff}, h2[3] = {0x4080, 0xbc00, 0x7bff}, h3[3];
  tide__reduce(h3, h1, h2, 3, TIDE_F16, TIDE_SUM);
  CHECK(h3[0] == 0x4380 && (h3[1] & 0x7fff) == 0 && h3[2] == 0x7c00); /* 65504*2 overflows to inf */
  /* bf16: 1.0 + 1.0 = 2.0 (0x3f80, 0x4000), rounding to nearest even */
  uint16_t g1[2] = {0x3f80, 0x3f80}, g2[2] = {0x3f80, 0x3b80}, g3[2];
  tide__reduce(g3, g1, g2, 2, TIDE_BF16, TIDE_SUM);
  CHECK(g3[0] == 0x4000);
  CHECK(g3[1] == 0x3f80); /* 1 + 2^-8: exactly halfway, ties to even */
  /* the shm transport's non-temporal copy: every alignment of either side, sizes around its 16-byte head
   * and 64-byte steps, and nothing written outside [dst, dst + n) */
  unsigned char src[300], dst[340];
  for (int i = 0; i < 300; i++) src[i] = (unsigned char)(i * 7 + 1);
  for (size_t so = 0; so < 16; so += 5)
    for (size_t doff = 0; doff < 20; doff += 3)
      for (size_t n = 0; n <= 283; n += n < 20 ? 1 : 37) {
        memset(dst, 0xee, sizeof dst);
        tide__copy_stream(dst + doff, src + so, n);
        CHECK(memcmp(dst + doff, src + so, n) == 0);
        for (size_t q = 0; q < sizeof dst; q++)
          if (q < doff || q >= doff + n) CHECK(dst[q] == 0xee);
      }
}

static void blocks(void) {
  for (size_t count = 0; count < 40; count++)
    for (int size = 1; size <= 7; size++) {
      size_t next = 0;
      for (int r = 0; r < size; r++) {
        size_t off, len;
        tide_block(count, size, r, &off, &len);
        CHECK(off == next);
        CHECK(len == count / (size_t)size || len == count / (size_t)size + 1);
        next = off + len;
      }
      CHECK(next == count);
    }
}

static int child_with_env(const char *name, const char *value) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TIDE_LOG_LEVEL", "error", 1);
    setenv(name, value, 1);
    _exit(tide_params_load() == TIDE_EINVAL ? 0 : 1);
  }
  int status;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* In a child with name=value: the load's error (in the log file) holds
 * want, or (want NULL) the load succeeds and the ENUM parameter id reads as
 * index. */
static int child_enum(const char *name, const char *value, const char *want, int id, int index) {
  char log[] = "/tmp/test_core_enum.XXXXXX";
  int fd = mkstemp(log);
  CHECK(fd >= 0);
  close(fd);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TIDE_LOG_FILE", log, 1);
    setenv(name, value, 1);
    int rc = tide_params_load();
    if (want == NULL) _exit(rc == 0 && tide__param_enum(id) == index ? 0 : 1);
    FILE *f = fopen(log, "r");
    char text[4096] = "";
    size_t n = f != NULL ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f != NULL) fclose(f);
    _exit(rc == TIDE_EINVAL && strstr(text, want) != NULL ? 0 : 1);
  }
  int status;
  waitpid(pid, &status, 0);
  unlink(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static void params(void) {
  CHECK(child_with_env("TIDE_TIMEOUT_MS", "soon") == 0);
  CHECK(child_with_env("TIDE_TIMEOUT_MS", "0") == 0);
  CHECK(child_with_env("TIDE_SHM", "2") == 0);
  CHECK(child_with_env("TIDE_ALGO", "fastest") == 0);
  CHECK(child_with_env("TIDE_LOG_LEVEL", "loud") == 0);
  /* Enum-valued parameters: one validator, its message listing the names the table declares. */
  CHECK(child_enum("TIDE_ALGO", "fastest", "TIDE_ALGO=\"fastest\" is not one of auto, ring, rd, hier or mpi", 0, 0) == 0);
  CHECK(child_enum("TIDE_BACKEND", "nccl", "TIDE_BACKEND=\"nccl\" is not one of auto or mpi", 0, 0) == 0);
  CHECK(child_enum("TIDE_STRAGGLER", "kill", "TIDE_STRAGGLER=\"kill\" is not one of off, report or remove", 0, 0) == 0);
  CHECK(child_enum("TIDE_BIND", "cores", "is not one of auto, core, numa or none", 0, 0) == 0);
  CHECK(child_enum("TIDE_ALGO", "hier", NULL, TIDE__PARAM_ALGO, 3) == 0);
  CHECK(child_enum("TIDE_LOG_LEVEL", "debug", NULL, TIDE__PARAM_LOG_LEVEL, TIDE__LOG_DEBUG) == 0);
  CHECK(tide__param_enum(TIDE__PARAM_BACKEND) == 0); /* the default, auto */
  CHECK(tide__param_int(TIDE__PARAM_SHM_RING_BYTES) >= 65536);
  FILE *f = tmpfile();
  tide_params_print(f, 1);
  long size = ftell(f);
  CHECK(size > 500);
  fclose(f);
}

int main(void) {
  errors();
  hmac();
  params();
  allocator();
  kernels();
  blocks();
  return 0;
}
