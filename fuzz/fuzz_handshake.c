/* libFuzzer harness: the job-token handshake from both sides and the peer
 * hello, fed what a stranger might send.
 *   - the connecting side (tide__auth_handshake) reads the input as the
 *     server's bytes over a socketpair (then end of stream);
 *   - the accepting side's step (tide__auth_server_check) checks every
 *     prefix of the input as the client's bytes;
 *   - the hello that follows (tide__peer_hello_check) parses its first bytes. */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char token[] = "fuzz-token";
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  size_t fed = size < 4096 ? size : 4096; /* within the socket buffer: write never blocks */
  if (fed > 0 && write(sv[1], data, fed) != (ssize_t)fed) {
    close(sv[0]);
    close(sv[1]);
    return 0;
  }
  shutdown(sv[1], SHUT_WR);
  int rc = tide__auth_handshake(sv[0], token, 0, tide__deadline_after_ms(1000));
  if (rc != 0 && rc != TIDE_EAUTH && rc != TIDE_EPEER) __builtin_trap();
  close(sv[0]);
  close(sv[1]);

  uint8_t hello[TIDE__AUTH_HELLO_BYTES], answer[TIDE__AUTH_PROOF_BYTES];
  memcpy(hello, "TIDEAUTH1", 9);
  memset(hello + 9, 0x5a, sizeof hello - 9);
  for (size_t len = 0; len <= size && len <= TIDE__AUTH_CLIENT_BYTES + 1; len++) {
    const char *why = NULL;
    rc = tide__auth_server_check(hello, token, data, len, answer, &why);
    if (rc < 0 && ((rc != TIDE_EAUTH && rc != TIDE_EPROTO) || why == NULL)) __builtin_trap();
    if (rc == 1) __builtin_trap(); /* nobody forges the proof without the token */
    if (rc < 0) break;
  }

  tide__peer_hello_t peer;
  if (size >= sizeof peer) {
    memcpy(&peer, data, sizeof peer);
    rc = tide__peer_hello_check(&peer, 0x1234, 3, 8);
    if (rc == 0 && (peer.rank <= 3 || peer.rank >= 8)) __builtin_trap();
  }
  return 0;
}
