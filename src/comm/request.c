/* Nonblocking requests: tasks queued on the communicator and executed in
 * call order by its progress thread, so training code can overlap
 * communication with computation. A thread that waits for a task still in
 * the queue runs the queue up to it itself instead of sleeping until the
 * progress thread is scheduled (on an oversubscribed host that hand-off
 * costs two wake-ups a request). One task runs at a time (comm->executing),
 * taken from the head, so the order stays the call order. */
#include <string.h>

#include "comm/comm.h"

struct tide__task {
  tide__task_cb fn;
  tide_comm_t *comm;
  int rc, done;
  tide__task_t *next;
  size_t args_size;
  max_align_t args[]; /* copied arguments */
};

struct tide_request {
  tide__task_t task;
};

/* Takes the head task and runs it; called with queue_lock held and no task
 * executing, returns with queue_lock held. */
static void run_head(tide_comm_t *comm) {
  tide__task_t *task = comm->queue_head;
  comm->queue_head = task->next;
  if (comm->queue_head == NULL) comm->queue_tail = NULL;
  comm->executing = 1;
  pthread_mutex_unlock(&comm->queue_lock);
  pthread_mutex_lock(&comm->exec_lock);
  int rc = task->fn(comm, task->args);
  pthread_mutex_unlock(&comm->exec_lock);
  pthread_mutex_lock(&comm->queue_lock);
  comm->executing = 0;
  task->rc = rc;
  task->done = 1;
  comm->completed++;
  pthread_cond_broadcast(&comm->queue_cond);
}

static void *progress_main(void *arg) {
  tide_comm_t *comm = arg;
  pthread_mutex_lock(&comm->queue_lock);
  for (;;) {
    if (comm->queue_head != NULL && !comm->executing)
      run_head(comm);
    else if (comm->progress_stop && comm->queue_head == NULL)
      break;
    else
      pthread_cond_wait(&comm->queue_cond, &comm->queue_lock);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  return NULL;
}

int tide__task_submit(tide_comm_t *comm, tide__task_cb fn, const void *args, size_t args_size,
                      tide_request_t **out) {
  tide__task_t *task = tide__calloc(1, sizeof *task + args_size);
  if (task == NULL) return TIDE_ENOMEM;
  task->fn = fn;
  task->comm = comm;
  task->args_size = args_size;
  memcpy(task->args, args, args_size);
  pthread_mutex_lock(&comm->queue_lock);
  if (!comm->progress_running) {
    if (pthread_create(&comm->progress_thread, NULL, progress_main, comm) != 0) {
      pthread_mutex_unlock(&comm->queue_lock);
      tide__free(task);
      return TIDE_ENOMEM;
    }
    comm->progress_running = 1;
  }
  if (comm->queue_tail != NULL)
    comm->queue_tail->next = task;
  else
    comm->queue_head = task;
  comm->queue_tail = task;
  comm->issued++;
  pthread_cond_broadcast(&comm->queue_cond);
  pthread_mutex_unlock(&comm->queue_lock);
  *out = (tide_request_t *)task;
  return 0;
}

void tide__task_drain(tide_comm_t *comm) {
  pthread_mutex_lock(&comm->queue_lock);
  while (comm->completed < comm->issued) pthread_cond_wait(&comm->queue_cond, &comm->queue_lock);
  pthread_mutex_unlock(&comm->queue_lock);
}

void tide__task_fini(tide_comm_t *comm) {
  pthread_mutex_lock(&comm->queue_lock);
  int running = comm->progress_running;
  comm->progress_stop = 1;
  pthread_cond_broadcast(&comm->queue_cond);
  pthread_mutex_unlock(&comm->queue_lock);
  if (running) pthread_join(comm->progress_thread, NULL);
}

/* Whether task is still in the queue (queue_lock held). */
static int queued(const tide_comm_t *comm, const tide__task_t *task) {
  for (const tide__task_t *t = comm->queue_head; t != NULL; t = t->next)
    if (t == task) return 1;
  return 0;
}

int tide_wait(tide_request_t *req) {
  if (req == NULL) return tide__null_arg("tide_wait", "req");
  tide__task_t *task = &req->task;
  tide_comm_t *comm = task->comm;
  pthread_mutex_lock(&comm->queue_lock);
  while (!task->done) {
    /* Not taken yet (done and executing tasks are out of the queue): run
     * the queue up to it here. */
    if (!comm->executing && comm->queue_head != NULL && queued(comm, task))
      run_head(comm);
    else
      pthread_cond_wait(&comm->queue_cond, &comm->queue_lock);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  int rc = task->rc;
  tide__free(task);
  return rc;
}

int tide_test(tide_request_t *req, int *done) {
  if (req == NULL || done == NULL) return tide__null_arg("tide_test", req == NULL ? "req" : "done");
  tide_comm_t *comm = req->task.comm;
  pthread_mutex_lock(&comm->queue_lock);
  *done = req->task.done;
  pthread_mutex_unlock(&comm->queue_lock);
  return 0;
}
