/* TCP at scale: more operations in flight than the engine used to poll.
 *
 *   test_tcp_scale [poll]  one process, 80 TCP channels over loopback, 80
 *                          receives posted at once; the data of the 76th
 *                          arrives while the engine sleeps. The engine once
 *                          polled only the first 64 sockets, so it slept
 *                          through that data until its 1 s poll timeout
 *                          (comm->overslept counts such sleeps).
 *   test_tcp_scale 48      48 ranks on 12 emulated hosts of 4 (TIDE_HOST_ID:
 *   test_tcp_scale 64      shared memory inside a host, TCP across), and 64
 *                          ranks on 16 hosts of 4: the collective conformance
 *                          suite (counts up to 1000) and alltoallv of small
 *                          blocks, each checked against its reference, with
 *                          no wait sleeping while its data was ready
 *                          (comm->overslept stays 0 on every rank).
 *   test_tcp_scale 48tcp   the same on 48 ranks, TCP only (94 operations per
 *                          alltoallv).
 *   test_tcp_scale emu64   64 ranks on 16 hosts of 4 emulated with network
 *                          namespaces (scripts/emulate-cluster.sh: 1 Gbit/s,
 *                          0.2 ms one way), each rank running
 *   test_tcp_scale rank    (one rank of a job someone else started): the
 *                          same checks, the suite's per-dtype part in f32
 *                          only (every dtype ran at 64 ranks in the "64"
 *                          case; all of them here took 56 s of the 2-core
 *                          machine, f32 alone 17 s). Skips (77) where the
 *                          script cannot make namespaces (not root).
 *
 * No timing is asserted: a stall shows as an oversleep, counted by the
 * engine when a sleep runs to its timeout while a socket it should have
 * watched was ready. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll_suite.h"
#include "comm/comm.h"
#include "harness.h"

/* ---- poll: more sockets than 64 ---------------------------------------- */

#define CHANNELS 80
#define LATE 75 /* the channel whose data comes while the engine sleeps */

typedef struct {
  int send_fd[CHANNELS]; /* our ends of the loopback connections */
  int recv_fd[CHANNELS]; /* the channels' ends */
} links_t;

static void send_value(int fd, uint64_t v) { CHECK(write(fd, &v, sizeof v) == (ssize_t)sizeof v); }

/* Sends LATE's value once the engine has had time to fall asleep, waits
 * until the engine has read it, then sends the others. */
static void *feeder(void *arg) {
  links_t *l = arg;
  usleep(100 * 1000);
  send_value(l->send_fd[LATE], 1000 + LATE);
  for (;;) { /* the engine reads it when it wakes: at once when it polls this socket, after 1 s when not */
    int queued = 0;
    CHECK(ioctl(l->recv_fd[LATE], FIONREAD, &queued) == 0);
    if (queued == 0) break;
    usleep(1000);
  }
  for (int i = 0; i < CHANNELS; i++)
    if (i != LATE) send_value(l->send_fd[i], 1000 + (uint64_t)i);
  return NULL;
}

static int test_poll(void) {
  CHECK_OK(tide_params_load());
  links_t links;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(lfd, CHANNELS) == 0);
  CHECK(getsockname(lfd, (struct sockaddr *)&addr, &len) == 0);
  for (int i = 0; i < CHANNELS; i++) {
    links.send_fd[i] = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(links.send_fd[i], (struct sockaddr *)&addr, sizeof addr) == 0);
    links.recv_fd[i] = accept(lfd, NULL, NULL);
    CHECK(links.recv_fd[i] >= 0);
  }
  close(lfd);

  /* A communicator of CHANNELS + 1 ranks, built by hand: we are the last. */
  tide_comm_t *comm = tide__comm_alloc();
  CHECK(comm != NULL);
  comm->size = CHANNELS + 1;
  comm->rank = CHANNELS;
  comm->spin_us = 0; /* sleep as soon as nothing moves */
  comm->chans = tide__calloc((size_t)comm->size, sizeof *comm->chans); /* tide_comm_destroy frees it */
  CHECK(comm->chans != NULL);
  const tide__link_t link = {0, NULL};
  const tide__transport_ops_t *tcp = tide__transport_pick(&link);
  CHECK(tcp != NULL && tcp->connect != NULL);
  for (int i = 0; i < CHANNELS; i++) {
    tide__endpoint_t ep = {links.recv_fd[i], NULL};
    CHECK_OK(tcp->connect(&comm->chans[i], i, &ep));
  }
  comm->chans[CHANNELS].fd = -1;

  uint64_t got[CHANNELS];
  tide__p2p_t ops[CHANNELS];
  for (int i = 0; i < CHANNELS; i++)
    tide__p2p_set(&ops[i], TIDE__P2P_RECV, i, NULL, &got[i], sizeof got[i], TIDE_I64, TIDE_SUM);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, feeder, &links) == 0);
  CHECK_OK(tide__comm_run(comm, ops, CHANNELS, "test"));
  pthread_join(thread, NULL);
  for (int i = 0; i < CHANNELS; i++) CHECK(got[i] == 1000 + (uint64_t)i);
  if (comm->overslept != 0) {
    fprintf(stderr, "the engine slept %llu time(s) while channel %d's data was ready (not polled)\n",
            (unsigned long long)comm->overslept, LATE);
    exit(1);
  }
  for (int i = 0; i < CHANNELS; i++) close(links.send_fd[i]);
  tide_comm_destroy(comm);
  printf("ok: %d receives posted over TCP, the 76th woke the engine\n", CHANNELS);
  return 0;
}

/* ---- many ranks --------------------------------------------------------- */

/* Block sizes from src to dst: small, and some empty (no op posted). */
static size_t block_bytes(int src, int dst, int round) { return (size_t)((src * 7 + dst * 3 + round) % 5) * 24; }

static uint8_t block_byte(int src, int dst, int round, size_t i) {
  return (uint8_t)(src * 31 + dst * 17 + round * 5 + (int)i);
}

static void alltoallv_rounds(tide_comm_t *comm, int rounds) {
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  size_t *send_bytes = calloc((size_t)size, sizeof *send_bytes), *recv_bytes = calloc((size_t)size, sizeof *recv_bytes);
  size_t *send_displs = calloc((size_t)size, sizeof *send_displs), *recv_displs = calloc((size_t)size, sizeof *recv_displs);
  CHECK(send_bytes && recv_bytes && send_displs && recv_displs);
  for (int round = 0; round < rounds; round++) {
    size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < size; p++) {
      send_bytes[p] = block_bytes(rank, p, round);
      recv_bytes[p] = block_bytes(p, rank, round);
      send_displs[p] = send_total;
      recv_displs[p] = recv_total;
      send_total += send_bytes[p];
      recv_total += recv_bytes[p];
    }
    uint8_t *sendbuf = malloc(send_total + 1), *recvbuf = malloc(recv_total + 1);
    CHECK(sendbuf && recvbuf);
    for (int p = 0; p < size; p++)
      for (size_t i = 0; i < send_bytes[p]; i++) sendbuf[send_displs[p] + i] = block_byte(rank, p, round, i);
    memset(recvbuf, 0xee, recv_total + 1);
    CHECK_OK(tide__alltoallv_bytes(comm, sendbuf, send_bytes, send_displs, recvbuf, recv_bytes, recv_displs));
    for (int p = 0; p < size; p++)
      for (size_t i = 0; i < recv_bytes[p]; i++)
        if (recvbuf[recv_displs[p] + i] != block_byte(p, rank, round, i)) {
          fprintf(stderr, "rank %d: alltoallv round %d: byte %zu from rank %d is wrong\n", rank, round, i, p);
          exit(1);
        }
    free(sendbuf);
    free(recvbuf);
  }
  free(send_bytes);
  free(recv_bytes);
  free(send_displs);
  free(recv_displs);
}

/* arg: the dtype of the suite's per-dtype part, -1 for all (coll_suite_run). */
static int many_ranks(int rank, int size, void *arg) {
  int dtype = *(const int *)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  CHECK(rank < 0 || (tide_comm_rank(comm) == rank && tide_comm_size(comm) == size));
  coll_suite_run(comm, 1000, dtype);
  alltoallv_rounds(comm, 8);
  if (comm->overslept != 0) {
    fprintf(stderr, "rank %d: %llu wait(s) slept while their data was ready\n", rank,
            (unsigned long long)comm->overslept);
    exit(1);
  }
  tide_comm_destroy(comm);
  return 0;
}

static int test_ranks(int np, int per_host, int tcp_only) {
  static char names[64][16];
  const char *hosts[64];
  for (int r = 0; r < np; r++) {
    snprintf(names[r], sizeof names[r], "h%d", r / per_host);
    hosts[r] = names[r];
  }
  harness_opts_t opts = {np, hosts, tcp_only, 240, NULL};
  int every = -1;
  if (harness_run(&opts, many_ranks, &every) != 0) return 1;
  printf("ok: %d ranks on %d emulated hosts%s: conformance suite and alltoallv correct, no wait overslept\n", np,
         np / per_host, tcp_only ? " (TCP only)" : "");
  return 0;
}

static int test_emulated_hosts(void) {
  const char *source = getenv("TIDE_SOURCE_DIR"), *tools = getenv("TIDE_TOOLS_DIR");
  if (source == NULL || tools == NULL) {
    fprintf(stderr, "emu64 needs TIDE_SOURCE_DIR and TIDE_TOOLS_DIR (ctest sets them)\n");
    return 1;
  }
  char self[4096] = "", cmd[16384];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK(n > 0);
  self[n] = '\0';
  snprintf(cmd, sizeof cmd,
           "bash '%s/scripts/emulate-cluster.sh' --build '%s/..' --hosts 16 --ranks-per-host 4 --bandwidth 1gbit "
           "--latency 0.2ms --timeout 180 -- '%s' rank",
           source, tools, self);
  fflush(NULL);
  int status = system(cmd);
  CHECK(status != -1 && WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    printf("SKIP: scripts/emulate-cluster.sh cannot make namespaces here\n");
    return 77;
  }
  if (WEXITSTATUS(status) != 0) {
    fprintf(stderr, "64 ranks on 16 emulated hosts: the job exited with %d\n", WEXITSTATUS(status));
    return 1;
  }
  printf("ok: 64 ranks on 16 network-namespace hosts: conformance suite and alltoallv correct, no wait overslept\n");
  return 0;
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "poll";
  if (strcmp(which, "poll") == 0) return test_poll();
  if (strcmp(which, "48") == 0) return test_ranks(48, 4, 0);
  if (strcmp(which, "64") == 0) return test_ranks(64, 4, 0);
  if (strcmp(which, "48tcp") == 0) return test_ranks(48, 1, 1);
  if (strcmp(which, "emu64") == 0) return test_emulated_hosts();
  if (strcmp(which, "rank") == 0) {
    int f32 = TIDE_F32; /* the suite's dtypes ran at 64 ranks in test_tcp_scale_64 */
    return many_ranks(-1, -1, &f32);
  }
  fprintf(stderr, "usage: test_tcp_scale poll|48|64|48tcp|emu64|rank\n");
  return 2;
}
