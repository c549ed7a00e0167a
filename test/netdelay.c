/* tide-netdelay: holds every packet of one netfilter queue for a fixed time,
 * then accepts it. scripts/emulate-cluster.sh runs it in the switch namespace
 * to add one-way latency on kernels without sch_netem (docs/emulated-cluster.md):
 * an iptables rule there sends every bridged IPv4 packet to NFQUEUE QUEUE,
 * and this program gives each one its verdict DELAY_US after it arrived.
 *
 *   usage: tide-netdelay QUEUE DELAY_US
 *   prints "ready" on stdout once bound; runs until SIGTERM or SIGINT, then
 *   accepts what it still holds, unbinds and exits 0. Exits 1 when the queue
 *   cannot be bound or the netlink socket fails, 2 on a usage error.
 *
 * Only metadata crosses to user space (copy mode META) and GSO packets stay
 * whole, so 1 Gbit/s of TCP is a few thousand packets a second. One delay for
 * every packet means arrival order is due order: the held packets form a FIFO
 * sorted by due time, and one batch verdict (which accepts every queued id up
 * to the one given) releases all that are due, in order.
 *
 * Timing: CLOCK_MONOTONIC throughout; ppoll() with a 1 ns timer slack. A
 * timed wake-up still comes some tens of microseconds late on a busy machine,
 * so the program measures that lateness (a moving average) and asks to be
 * woken that much earlier; a packet due within RELEASE_SLACK_NS of the wake-up
 * is released with it.
 *
 * Threads: one. Signals are blocked and read from a signalfd. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/netfilter.h> /* NF_ACCEPT */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#define QUEUE_MAXLEN 100000          /* packets the kernel holds for us; more are dropped */
#define HELD_CAP (1u << 17)          /* > QUEUE_MAXLEN, a power of two */
#define RCVBUF_BYTES (8 << 20)       /* room for bursts while we sleep */
#define RECV_BUF_BYTES 65536         /* one netlink message per packet; metadata only */
#define DRAIN_MAX 256                /* messages read before due packets are released again */
#define RELEASE_SLACK_NS 20000       /* release what is due this close to now */
#define CALIBRATION_SLEEPS 15
#define MAX_DELAY_US 10000000        /* 10 s */
#define MAX_SEND_RETRIES 1000        /* consecutive transient verdict failures */
#define EXIT_FAILURE_RUN 1
#define EXIT_USAGE 2

static const char *me = "tide-netdelay";

typedef struct {
  int64_t due_ns;
  uint32_t id;
} held_t;

/* The delayer's whole state; main() owns it. */
typedef struct {
  struct nfq_handle *h;
  struct nfq_q_handle *qh;
  int fd;
  uint16_t queue;
  int64_t delay_ns;
  int64_t late_ns;    /* how late a timed wake-up comes (moving average) */
  int64_t recv_ns;    /* when the message being parsed was read */
  held_t *held;       /* ring of HELD_CAP, oldest (first due) at head */
  uint32_t head, count;
  int send_failures;  /* consecutive transient verdict send failures */
  uint64_t packets, verdicts, kernel_errors;
  uint32_t max_held;
} delayer_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct timespec to_timespec(int64_t ns) {
  struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
  return ts;
}

/* Parses a whole decimal number in [lo, hi]; 0 on success. */
static int parse_long(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* Accepts every held packet due by until_ns with one batch verdict. The
 * packets leave the FIFO only once the verdict is sent; a transient send
 * failure (no memory, say) keeps them for the next round. 0, or -1 on a
 * failure that would leave packets stuck. */
static int release_due(delayer_t *d, int64_t until_ns) {
  uint32_t n = 0;
  while (n < d->count && d->held[(d->head + n) & (HELD_CAP - 1)].due_ns <= until_ns) n++;
  if (n == 0) return 0;
  uint32_t last = d->held[(d->head + n - 1) & (HELD_CAP - 1)].id;
  if (nfq_set_verdict_batch(d->qh, last, NF_ACCEPT) < 0) {
    int e = errno;
    if ((e == ENOBUFS || e == ENOMEM || e == EAGAIN || e == EINTR) && ++d->send_failures < MAX_SEND_RETRIES)
      return 0;
    fprintf(stderr, "%s: cannot send the verdict for packets up to id %" PRIu32 ": %s\n", me, last, strerror(e));
    return -1;
  }
  d->send_failures = 0;
  d->head = (d->head + n) & (HELD_CAP - 1);
  d->count -= n;
  d->verdicts++;
  return 0;
}

/* nfq_handle_packet's callback, once per queued packet: holds it. */
static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *arg) {
  (void)qh;
  (void)msg;
  delayer_t *d = arg;
  struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
  if (ph == NULL) return 0;
  /* Cannot happen while the kernel holds at most QUEUE_MAXLEN: release the
   * oldest early rather than lose track of a packet. */
  if (d->count == HELD_CAP && release_due(d, d->held[d->head].due_ns) != 0) return -1;
  if (d->count == HELD_CAP) return -1;
  d->held[(d->head + d->count) & (HELD_CAP - 1)] = (held_t){d->recv_ns + d->delay_ns, ntohl(ph->packet_id)};
  d->count++;
  d->packets++;
  if (d->count > d->max_held) d->max_held = d->count;
  return 0;
}

/* Reads what the kernel queued, up to DRAIN_MAX messages. 0, or -1 when the
 * socket fails. */
static int drain(delayer_t *d) {
  static char buf[RECV_BUF_BYTES] __attribute__((aligned(8)));
  for (int i = 0; i < DRAIN_MAX; i++) {
    ssize_t n = recv(d->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR || errno == ENOBUFS) continue;
      fprintf(stderr, "%s: reading netfilter queue %u: %s\n", me, d->queue, strerror(errno));
      return -1;
    }
    d->recv_ns = now_ns();
    /* < 0 when the message is an error the kernel sent back (a verdict for
     * ids it no longer holds): counted, not fatal. */
    if (nfq_handle_packet(d->h, buf, (int)n) < 0 && d->kernel_errors++ == 0)
      fprintf(stderr, "%s: the kernel reported an error on queue %u: %s\n", me, d->queue, strerror(errno));
  }
  return 0;
}

/* How late a ppoll() timeout of delay_ns fires here: the median of a few,
 * at most half the delay. */
static int64_t measure_lateness(int64_t delay_ns) {
  if (delay_ns == 0) return 0;
  int64_t late[CALIBRATION_SLEEPS];
  for (int i = 0; i < CALIBRATION_SLEEPS; i++) {
    struct timespec ts = to_timespec(delay_ns);
    int64_t t = now_ns();
    ppoll(NULL, 0, &ts, NULL);
    late[i] = now_ns() - t - delay_ns;
  }
  for (int i = 1; i < CALIBRATION_SLEEPS; i++)
    for (int j = i; j > 0 && late[j] < late[j - 1]; j--) {
      int64_t t = late[j];
      late[j] = late[j - 1];
      late[j - 1] = t;
    }
  int64_t m = late[CALIBRATION_SLEEPS / 2];
  return m < 0 ? 0 : m > delay_ns / 2 ? delay_ns / 2 : m;
}

/* Opens the queue with the settings the delay needs. 0, or -1 after a
 * message naming what failed. */
static int delayer_open(delayer_t *d) {
  d->held = malloc(HELD_CAP * sizeof *d->held);
  if (d->held == NULL) {
    fprintf(stderr, "%s: out of memory\n", me);
    return -1;
  }
  d->h = nfq_open();
  if (d->h == NULL) {
    fprintf(stderr, "%s: cannot open a netfilter queue handle: %s (needs CAP_NET_ADMIN)\n", me, strerror(errno));
    return -1;
  }
  d->fd = nfq_fd(d->h);
  d->qh = nfq_create_queue(d->h, d->queue, on_packet, d);
  if (d->qh == NULL) {
    fprintf(stderr, "%s: cannot bind netfilter queue %u: %s (another process bound to it? not root?)\n", me,
            d->queue, strerror(errno));
    return -1;
  }
  if (nfq_set_mode(d->qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(d->qh, QUEUE_MAXLEN) < 0) {
    fprintf(stderr, "%s: cannot configure netfilter queue %u: %s\n", me, d->queue, strerror(errno));
    return -1;
  }
  /* Without it the kernel segments GSO packets before queueing them: 40
   * times the verdicts at 1 Gbit/s. Old kernels lack it; they still work. */
  if (nfq_set_queue_flags(d->qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
    fprintf(stderr, "%s: warning: queue %u: no GSO flag (%s); packets are queued segmented\n", me, d->queue,
            strerror(errno));
  int size = RCVBUF_BYTES, one = 1;
  if (setsockopt(d->fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
    setsockopt(d->fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  /* A full receive buffer drops packets (TCP recovers); it must not also
   * make every later recv() fail with ENOBUFS. */
  setsockopt(d->fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
  return 0;
}

/* Accepts whatever is still held or queued, unbinds, frees. Accepts NULL
 * handles (a partly opened delayer). */
static void delayer_close(delayer_t *d) {
  if (d->qh != NULL) {
    drain(d);
    release_due(d, INT64_MAX);
    /* The unbind waits for the kernel's acknowledgement: bound the wait. */
    struct timeval tv = {.tv_sec = 1};
    setsockopt(d->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    nfq_destroy_queue(d->qh);
  }
  if (d->h != NULL) nfq_close(d->h);
  free(d->held);
}

/* The loop: sleep until the first held packet is due or the kernel queues
 * more, read them, release what is due. Returns the exit status. */
static int run(delayer_t *d, int sfd) {
  struct pollfd fds[2] = {{.fd = d->fd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
  for (;;) {
    struct timespec ts, *timeout = NULL;
    int64_t wake_ns = 0, wait_ns = 0;
    if (d->count > 0) {
      wake_ns = d->held[d->head].due_ns - d->late_ns;
      wait_ns = wake_ns - now_ns();
      if (wait_ns < 0 || d->send_failures > 0) wait_ns = 0;
      ts = to_timespec(wait_ns);
      timeout = &ts;
    }
    int n = ppoll(fds, 2, timeout, NULL);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "%s: poll: %s\n", me, strerror(errno));
      return EXIT_FAILURE_RUN;
    }
    if (n == 0 && wait_ns > 0) {
      int64_t late = (9 * d->late_ns + (now_ns() - wake_ns)) / 10;
      d->late_ns = late < 0 ? 0 : late > d->delay_ns / 2 ? d->delay_ns / 2 : late;
    }
    if (fds[1].revents != 0) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
        fprintf(stderr, "%s: %s: stopping (%" PRIu64 " packets in %" PRIu64 " verdicts, at most %" PRIu32
                        " held at once)\n",
                me, strsignal((int)si.ssi_signo), d->packets, d->verdicts, d->max_held);
      return 0;
    }
    if (fds[0].revents != 0 && drain(d) != 0) return EXIT_FAILURE_RUN;
    if (release_due(d, now_ns() + RELEASE_SLACK_NS) != 0) return EXIT_FAILURE_RUN;
  }
}

int main(int argc, char **argv) {
  long queue, delay_us;
  if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: %s QUEUE DELAY_US\n"
           "Holds every packet of netfilter queue QUEUE (0-65535) for DELAY_US microseconds, then accepts it.\n"
           "Prints \"ready\" once bound; stops on SIGTERM or SIGINT. Needs CAP_NET_ADMIN.\n",
           me);
    return 0;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: %s QUEUE DELAY_US\n", me);
    return EXIT_USAGE;
  }
  if (parse_long(argv[1], 0, 65535, &queue) != 0) {
    fprintf(stderr, "%s: QUEUE '%s': give a queue number from 0 to 65535\n", me, argv[1]);
    return EXIT_USAGE;
  }
  if (parse_long(argv[2], 0, MAX_DELAY_US, &delay_us) != 0) {
    fprintf(stderr, "%s: DELAY_US '%s': give whole microseconds from 0 to %d\n", me, argv[2], MAX_DELAY_US);
    return EXIT_USAGE;
  }

  /* Signals are read from a signalfd; blocked ones are queued even when
   * the parent left them ignored (a background job's SIGINT). */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  sigprocmask(SIG_BLOCK, &stop, NULL);
  int sfd = signalfd(-1, &stop, SFD_CLOEXEC);
  if (sfd < 0) {
    fprintf(stderr, "%s: signalfd: %s\n", me, strerror(errno));
    return EXIT_FAILURE_RUN;
  }
  /* Wake when asked, not up to 50 us later (the default timer slack). */
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);

  delayer_t d = {.queue = (uint16_t)queue, .delay_ns = (int64_t)delay_us * 1000, .fd = -1};
  int rc = EXIT_FAILURE_RUN;
  if (delayer_open(&d) == 0) {
    d.late_ns = measure_lateness(d.delay_ns);
    printf("ready\n");
    fflush(stdout);
    rc = run(&d, sfd);
  }
  delayer_close(&d);
  close(sfd);
  return rc;
}
