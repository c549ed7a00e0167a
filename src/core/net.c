/* Socket helpers shared by the store and the TCP transport: listen,
 * connect with retry, exact send/receive with deadlines, and the job-token
 * handshake. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

int tide__socket_tune(int fd, int nonblocking) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int flags = fcntl(fd, F_GETFD);
  if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  if (nonblocking) {
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return TIDE_EIO;
  }
  return 0;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **out) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", port);
  int rc = getaddrinfo(host != NULL && host[0] ? host : NULL, port_text, &hints, out);
  if (rc != 0) {
    TIDE_ERROR("cannot resolve host \"%s\": %s", host ? host : "", gai_strerror(rc));
    return TIDE_EINVAL;
  }
  return 0;
}

int tide__tcp_listen(const char *host, int port, int *fd_out, int *port_out) {
  struct addrinfo *ai;
  TIDE_CHECK(resolve(host, port, 1, &ai));
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return TIDE_EIO;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    int err = errno;
    TIDE_ERROR("cannot listen on %s:%d: %s", host && host[0] ? host : "*", port, strerror(err));
    freeaddrinfo(ai);
    close(fd);
    return err == EADDRINUSE ? TIDE_EADDRINUSE : TIDE_EIO;
  }
  freeaddrinfo(ai);
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *fd_out = fd;
  if (port_out != NULL) *port_out = ntohs(sa.sin_port);
  return 0;
}

int tide__tcp_connect(const char *host, int port, int64_t deadline_ns, int *fd_out) {
  struct addrinfo *ai;
  TIDE_CHECK(resolve(host, port, 0, &ai));
  int delay_ms = 5;
  for (;;) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      freeaddrinfo(ai);
      tide__socket_tune(fd, 0);
      *fd_out = fd;
      return 0;
    }
    int err = errno;
    close(fd);
    if (err != ECONNREFUSED && err != EINTR && err != ETIMEDOUT && err != EHOSTUNREACH &&
        err != ENETUNREACH && err != EAGAIN) {
      TIDE_ERROR("cannot connect to %s:%d: %s", host, port, strerror(err));
      freeaddrinfo(ai);
      return TIDE_ECONNREFUSED;
    }
    if (tide__now_ns() >= deadline_ns) {
      TIDE_ERROR("cannot connect to %s:%d before the deadline: %s", host, port, strerror(err));
      freeaddrinfo(ai);
      return TIDE_ETIMEDOUT;
    }
    int left = tide__ms_left(deadline_ns);
    int sleep_ms = delay_ms < left ? delay_ms : left;
    struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    if (delay_ms < 200) delay_ms *= 2;
  }
  freeaddrinfo(ai);
  return TIDE_EIO;
}

static int wait_fd(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    int n = poll(&p, 1, tide__ms_left(deadline_ns));
    if (n > 0) return 0;
    if (n == 0) return TIDE_ETIMEDOUT;
    if (errno != EINTR) return TIDE_EIO;
  }
}

int tide__tcp_accept(int listen_fd, int64_t deadline_ns, int *fd_out) {
  for (;;) {
    TIDE_CHECK(wait_fd(listen_fd, POLLIN, deadline_ns));
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      tide__socket_tune(fd, 0);
      *fd_out = fd;
      return 0;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) return TIDE_EIO;
  }
}

int tide__send_all(int fd, const void *buf, size_t len, int64_t deadline_ns) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TIDE_CHECK(wait_fd(fd, POLLOUT, deadline_ns));
      continue;
    }
    return TIDE_EPEER;
  }
  return 0;
}

int tide__recv_all(int fd, void *buf, size_t len, int64_t deadline_ns) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) return TIDE_EPEER;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TIDE_CHECK(wait_fd(fd, POLLIN, deadline_ns));
      continue;
    }
    return TIDE_EPEER;
  }
  return 0;
}

int tide__parse_host_port(const char *text, char *host_out, size_t host_cap, int *port_out) {
  const char *colon = text != NULL ? strrchr(text, ':') : NULL;
  if (colon == NULL || colon == text || (size_t)(colon - text) >= host_cap) return TIDE_EINVAL;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || end == colon + 1 || port <= 0 || port > 65535) return TIDE_EINVAL;
  memcpy(host_out, text, (size_t)(colon - text));
  host_out[colon - text] = '\0';
  *port_out = (int)port;
  return 0;
}

int tide__ifname_addr(const char *ifname, char *addr_out, size_t cap) {
  struct ifaddrs *list;
  if (getifaddrs(&list) != 0) return TIDE_EIO;
  int rc = TIDE_ENOENT;
  for (struct ifaddrs *it = list; it != NULL; it = it->ifa_next) {
    if (it->ifa_addr == NULL || it->ifa_addr->sa_family != AF_INET) continue;
    if (strcmp(it->ifa_name, ifname) != 0) continue;
    inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, addr_out, (socklen_t)cap);
    rc = 0;
    break;
  }
  freeifaddrs(list);
  return rc;
}

int tide__sock_local_addr(int fd, char *addr_out, size_t cap) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 || sa.sin_family != AF_INET)
    return TIDE_EIO;
  inet_ntop(AF_INET, &sa.sin_addr, addr_out, (socklen_t)cap);
  return 0;
}

/* ---- job-token handshake ---- */

#define AUTH_MAGIC "TIDEAUTH1"
#define AUTH_MAGIC_LEN 9
_Static_assert(TIDE__AUTH_HELLO_BYTES == AUTH_MAGIC_LEN + 32, "hello = magic + nonce");

static void proof(const char *token, char role, const uint8_t *a, const uint8_t *b,
                  uint8_t out[32]) {
  uint8_t msg[1 + 64];
  msg[0] = (uint8_t)role;
  memcpy(msg + 1, a, 32);
  memcpy(msg + 33, b, 32);
  tide__hmac_sha256(token, strlen(token), msg, sizeof msg, out);
}

static int same(const uint8_t *a, const uint8_t *b, size_t n) {
  uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= a[i] ^ b[i];
  return diff == 0;
}

int tide__auth_handshake(int fd, const char *token, int server, int64_t deadline_ns) {
  uint8_t mine[AUTH_MAGIC_LEN + 32], theirs[AUTH_MAGIC_LEN + 32];
  memcpy(mine, AUTH_MAGIC, AUTH_MAGIC_LEN);
  TIDE_CHECK(tide__random_bytes(mine + AUTH_MAGIC_LEN, 32));
  TIDE_CHECK(tide__send_all(fd, mine, sizeof mine, deadline_ns));
  TIDE_CHECK(tide__recv_all(fd, theirs, sizeof theirs, deadline_ns));
  if (memcmp(theirs, AUTH_MAGIC, AUTH_MAGIC_LEN) != 0) return TIDE_EAUTH;
  const uint8_t *my_nonce = mine + AUTH_MAGIC_LEN, *their_nonce = theirs + AUTH_MAGIC_LEN;
  uint8_t expect[32], got[32], answer[32];
  if (server) {
    proof(token, 'C', my_nonce, their_nonce, expect);
    TIDE_CHECK(tide__recv_all(fd, got, 32, deadline_ns));
    if (!same(expect, got, 32)) {
      /* An answer that cannot verify tells the client at once. */
      memset(answer, 0, sizeof answer);
      tide__send_all(fd, answer, 32, deadline_ns);
      return TIDE_EAUTH;
    }
    proof(token, 'S', their_nonce, my_nonce, answer);
    return tide__send_all(fd, answer, 32, deadline_ns);
  }
  proof(token, 'C', their_nonce, my_nonce, answer);
  TIDE_CHECK(tide__send_all(fd, answer, 32, deadline_ns));
  /* A server that refuses our proof answers with one that cannot verify;
   * one that closes instead has gone away (TIDE_EPEER), whatever the reason. */
  TIDE_CHECK(tide__recv_all(fd, got, 32, deadline_ns));
  proof(token, 'S', my_nonce, their_nonce, expect);
  return same(expect, got, 32) ? 0 : TIDE_EAUTH;
}

int tide__auth_server_hello(uint8_t hello[TIDE__AUTH_HELLO_BYTES]) {
  memcpy(hello, AUTH_MAGIC, AUTH_MAGIC_LEN);
  return tide__random_bytes(hello + AUTH_MAGIC_LEN, 32);
}

int tide__auth_server_check(const uint8_t hello[TIDE__AUTH_HELLO_BYTES], const char *token, const uint8_t *in,
                            size_t len, uint8_t answer[TIDE__AUTH_PROOF_BYTES], const char **why) {
  size_t magic_len = len < AUTH_MAGIC_LEN ? len : AUTH_MAGIC_LEN;
  if (memcmp(in, AUTH_MAGIC, magic_len) != 0) {
    *why = "not a tide handshake";
    return TIDE_EPROTO;
  }
  if (len < TIDE__AUTH_CLIENT_BYTES) return 0;
  const uint8_t *my_nonce = hello + AUTH_MAGIC_LEN, *their_nonce = in + AUTH_MAGIC_LEN;
  uint8_t expect[32];
  proof(token, 'C', my_nonce, their_nonce, expect);
  if (!same(expect, in + TIDE__AUTH_HELLO_BYTES, 32)) {
    *why = "wrong job token";
    return TIDE_EAUTH;
  }
  proof(token, 'S', their_nonce, my_nonce, answer);
  return 1;
}

int tide_host_port_parse(const char *text, char *host, size_t host_cap, int *port) {
  if (text == NULL || host == NULL || port == NULL)
    return tide__null_arg("tide_host_port_parse", text == NULL ? "text" : host == NULL ? "host" : "port");
  return tide__parse_host_port(text, host, host_cap, port);
}
