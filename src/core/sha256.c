/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for the job-token
 * handshake. Small and portable; not on any hot path. */
#include <string.h>

#include "core.h"

typedef struct {
  uint32_t state[8];
  uint64_t length;
  uint8_t block[64];
  size_t used;
} sha256_t;

static const uint32_t k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(sha256_t *s, const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
           p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = s->state[0], b = s->state[1], c = s->state[2], d = s->state[3];
  uint32_t e = s->state[4], f = s->state[5], g = s->state[6], h = s->state[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  s->state[0] += a;
  s->state[1] += b;
  s->state[2] += c;
  s->state[3] += d;
  s->state[4] += e;
  s->state[5] += f;
  s->state[6] += g;
  s->state[7] += h;
}

static void sha_init(sha256_t *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->state, iv, sizeof iv);
  s->length = 0;
  s->used = 0;
}

static void sha_update(sha256_t *s, const void *data, size_t len) {
  const uint8_t *p = data;
  s->length += len;
  while (len > 0) {
    size_t take = 64 - s->used < len ? 64 - s->used : len;
    memcpy(s->block + s->used, p, take);
    s->used += take;
    p += take;
    len -= take;
    if (s->used == 64) {
      compress(s, s->block);
      s->used = 0;
    }
  }
}

static void sha_final(sha256_t *s, uint8_t out[32]) {
  uint64_t bits = s->length * 8;
  uint8_t pad = 0x80;
  sha_update(s, &pad, 1);
  pad = 0;
  while (s->used != 56) sha_update(s, &pad, 1);
  uint8_t len_be[8];
  for (int i = 0; i < 8; i++) len_be[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha_update(s, len_be, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->state[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->state[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->state[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->state[i];
  }
}

void tide__sha256(const void *data, size_t len, uint8_t out[32]) {
  sha256_t s;
  sha_init(&s);
  sha_update(&s, data, len);
  sha_final(&s, out);
}

void tide__hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                       uint8_t out[32]) {
  uint8_t k0[64] = {0}, ipad[64], opad[64], inner[32];
  if (key_len > 64)
    tide__sha256(key, key_len, k0);
  else
    memcpy(k0, key, key_len);
  for (int i = 0; i < 64; i++) {
    ipad[i] = k0[i] ^ 0x36;
    opad[i] = k0[i] ^ 0x5c;
  }
  sha256_t s;
  sha_init(&s);
  sha_update(&s, ipad, 64);
  sha_update(&s, msg, msg_len);
  sha_final(&s, inner);
  sha_init(&s);
  sha_update(&s, opad, 64);
  sha_update(&s, inner, 32);
  sha_final(&s, out);
}
