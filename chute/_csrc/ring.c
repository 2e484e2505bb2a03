/* GatherRing: the batches of a gather-only pass, built by native threads that never take the GIL.
 *
 * A Loader pass whose only worker stage is the gather of fixed-size columns from a local dataset spends most
 * of a worker's GIL-holding time around the copy, not in it (the batch task, the hand-over), and on a 2-core
 * machine the worker threads and the training loop take turns on the GIL for it. The ring takes the whole
 * batch off the GIL:
 *
 *   submit(step, indices, outs)  on the loop's thread, with the GIL: the indices resolved and checked
 *                                (IndexError), each touched shard's buffer checked against its rows once and
 *                                kept for the ring's life (Unmapped: map it and call again; CorruptShard), the
 *                                `outs` exported (one writable C-contiguous buffer per column, `len(indices)`
 *                                rows), the job queued. Nothing is queued unless every check passed.
 *   a worker thread, no GIL      takes the oldest queued job and copies its rows into its `outs`
 *                                (ch_copy_rows, the gather's own loop).
 *   wait(step, timeout)          on the loop's thread: waits, the GIL released, until the job is done (woken
 *                                once it and the steps right after it that other threads were copying as it
 *                                went to sleep are all done: one wake-up, not one per step); the exports
 *                                released; returns (start_ns, end_ns, idle_ns): the copy's span on the
 *                                CLOCK_MONOTONIC clock (time.perf_counter_ns's on Linux) and how long its worker
 *                                had waited for it. TimeoutError after `timeout` seconds (-1: for ever); None
 *                                when the step was dropped meanwhile.
 *
 * A job lives in place step % slots, as a Channel's results do: a step is submitted only after the one `slots`
 * before it was waited for or dropped (else ValueError). drop() ends a pass: queued jobs are dropped, running
 * ones finish, every job's exports are released, waiters wake. The threads stay for the next pass; resize()
 * sets how many take jobs (the others park); close() stops and joins them. The shards' buffers are kept until
 * close(): a local dataset never unmaps a shard while a Loader reads it (chute/format/reader.py).
 *
 * Locking: `mu` guards the jobs' states, the queue and the thread counts; a job's data is written by submit
 * before it is queued and read by one worker while it runs, and released by wait or drop once done (or never
 * started): never by two at once. Python objects are touched only with the GIL, never under `mu`.
 */
#include "native.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define RING_MAX_THREADS 64
#define RING_MAX_SLOTS 65536

enum { JOB_FREE, JOB_FILLING, JOB_QUEUED, JOB_RUNNING, JOB_DONE };

typedef struct {
    int state;
    int64_t step;
    Batch b;           /* the indices resolved: slot and row of each */
    const char **base; /* ncols x b.nslots: each column's first row in the shard of each slot */
    Py_buffer *outs;   /* ncols */
    int64_t start_ns, end_ns, idle_ns;
} Job;

typedef struct Ring Ring;

typedef struct {
    Ring *ring;
    int index;
    int64_t idle_since; /* when it began waiting for a job in this pass; -1: not counted (parked, between passes) */
    int ready;          /* its class is set: start_threads waits for it, so a thread resize() made is ready */
} Worker;

struct Ring {
    PyObject_HEAD
    PyObject *offsets;   /* the dataset's shard offsets (S + 1 int64) */
    Py_ssize_t ncols, nshards;
    PyObject **sources;  /* per column: the reader's list of per-shard buffers (None: not mapped) */
    int64_t *row_bytes;  /* per column */
    int64_t *shard_rows; /* per shard */
    Py_buffer *held;     /* ncols x nshards: the shards' buffers, exported once (obj NULL: not yet) */
    Py_ssize_t nslots;
    Job *jobs;
    int64_t *queue; /* queued steps, oldest first: a circle of nslots */
    Py_ssize_t qhead, qlen;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* a job was queued, the count changed, or stop */
    pthread_cond_t done_cv; /* a job is done, or jobs were dropped */
    int sync_made;
    Worker workers[RING_MAX_THREADS];
    pthread_t threads[RING_MAX_THREADS];
    int64_t awaited; /* the step wait() sleeps for (-1: none): only its job's end wakes it */
    int64_t awaited_hi; /* ... and the steps after it that were being copied then, up to this one: their ends too */
    int dropping;    /* drop() sleeps until the running jobs end: each end wakes it */
    int nthreads; /* threads started */
    int want;     /* threads taking jobs (index < want) */
    int stop;
    int policy;       /* the workers' scheduling class (-1: left as it is) */
    int64_t slice_ns; /* and time slice */
    pid_t pid;        /* the process that made the threads (a forked child has none of them) */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------------ the worker threads */

static void *work(void *arg)
{
    Worker *me = arg;
    Ring *r = me->ring;
    if (r->policy >= 0)
        ch_set_thread_class(r->policy, r->slice_ns);
    Py_ssize_t ncols = r->ncols;
    pthread_mutex_lock(&r->mu);
    me->ready = 1;
    pthread_cond_broadcast(&r->done_cv);
    for (;;) {
        while (!r->stop && (r->qlen == 0 || me->index >= r->want)) {
            if (me->index >= r->want)
                me->idle_since = -1; /* parked: not idle time of the pool */
            else if (me->idle_since < 0)
                me->idle_since = now_ns();
            pthread_cond_wait(&r->work_cv, &r->mu);
        }
        if (r->stop)
            break;
        Job *job = &r->jobs[r->queue[r->qhead] % r->nslots];
        r->qhead = (r->qhead + 1) % r->nslots;
        r->qlen--;
        job->state = JOB_RUNNING;
        int64_t since = me->idle_since;
        pthread_mutex_unlock(&r->mu);

        int64_t start = now_ns();
        job->idle_ns = since >= 0 && start > since ? start - since : 0;
        const Batch *b = &job->b;
        for (Py_ssize_t c = 0; c < ncols; c++)
            ch_copy_rows(job->outs[c].buf, job->base + c * b->nslots, b->slot, b->row, b->n, r->row_bytes[c]);
        int64_t end = now_ns();
        job->start_ns = start;
        job->end_ns = end;

        pthread_mutex_lock(&r->mu);
        job->state = JOB_DONE;
        me->idle_since = end;
        int wake = r->dropping;
        if (r->awaited >= 0 && job->step >= r->awaited && job->step <= r->awaited_hi) {
            wake = 1;
            for (int64_t s = r->awaited; s <= r->awaited_hi; s++) {
                const Job *o = &r->jobs[s % r->nslots];
                if (o->step == s && (o->state == JOB_QUEUED || o->state == JOB_RUNNING)) {
                    wake = 0;
                    break;
                }
            }
        }
        if (wake) /* a wake-up is a system call (and, on a VM, an interrupt) */
            pthread_cond_broadcast(&r->done_cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Under the GIL, not under mu: a job's resources, freed (its state is set by the caller). */
static void job_release(Ring *r, Job *job)
{
    if (job->outs != NULL) {
        for (Py_ssize_t c = 0; c < r->ncols; c++)
            ch_release(&job->outs[c]);
        PyMem_Free(job->outs);
        job->outs = NULL;
    }
    PyMem_Free((void *)job->base);
    job->base = NULL;
    ch_batch_close(&job->b);
}

/* With the GIL: start threads up to `want` (the count changes under mu: the threads read it). */
static int start_threads(Ring *r, int want)
{
    pthread_mutex_lock(&r->mu);
    r->want = want;
    pthread_cond_broadcast(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
    /* The threads block every signal (a thread inherits its creator's mask): a signal for the process goes
     * to one of its Python threads, whose wait it interrupts (Ctrl-C in the loop's next()). */
    sigset_t all, before;
    sigfillset(&all);
    while (r->nthreads < want) {
        Worker *w = &r->workers[r->nthreads];
        w->ring = r;
        w->index = r->nthreads;
        w->idle_since = -1;
        w->ready = 0;
        pthread_sigmask(SIG_SETMASK, &all, &before);
        int err = pthread_create(&r->threads[r->nthreads], NULL, work, w);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
#if defined(__linux__)
        if (err == 0) /* its name in /proc/<pid>/task/<tid>/comm, top, gdb: set before resize() returns */
            pthread_setname_np(r->threads[r->nthreads], "chute-gather");
#endif
        if (err != 0) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            pthread_mutex_lock(&r->mu);
            r->want = r->nthreads > 0 ? r->nthreads : 0;
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        r->nthreads++;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&r->mu);
        while (!w->ready)
            pthread_cond_wait(&r->done_cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
        Py_END_ALLOW_THREADS
    }
    return 0;
}

/* ------------------------------------------------------------------ the type */

static void ring_stop(Ring *r)
{
    if (!r->sync_made)
        return;
    if (r->pid == getpid()) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->work_cv);
        pthread_cond_broadcast(&r->done_cv);
        pthread_mutex_unlock(&r->mu);
        Py_BEGIN_ALLOW_THREADS
        for (int k = 0; k < r->nthreads; k++)
            pthread_join(r->threads[k], NULL); /* a worker copies one batch at most before it sees stop */
        Py_END_ALLOW_THREADS
    } /* else: a forked child, which has none of the threads (nor may it touch mu: a parent's thread held it) */
    r->nthreads = 0;
    for (Py_ssize_t k = 0; r->jobs != NULL && k < r->nslots; k++) {
        if (r->jobs[k].state != JOB_FREE) {
            job_release(r, &r->jobs[k]);
            r->jobs[k].state = JOB_FREE;
        }
    }
    r->qlen = 0;
    if (r->held != NULL) {
        for (Py_ssize_t k = 0; k < r->ncols * r->nshards; k++)
            ch_release(&r->held[k]);
    }
}

static void ring_dealloc(Ring *r)
{
    PyTypeObject *type = Py_TYPE(r);
    ring_stop(r);
    if (r->sync_made && r->pid == getpid()) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->work_cv);
        pthread_cond_destroy(&r->done_cv);
    }
    for (Py_ssize_t c = 0; r->sources != NULL && c < r->ncols; c++)
        Py_XDECREF(r->sources[c]);
    PyMem_Free(r->sources);
    PyMem_Free(r->row_bytes);
    PyMem_Free(r->shard_rows);
    PyMem_Free(r->held);
    PyMem_Free(r->jobs);
    PyMem_Free(r->queue);
    Py_XDECREF(r->offsets);
    type->tp_free((PyObject *)r);
    Py_DECREF(type);
}

static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"offsets", "sources", "row_bytes", "slots", "threads", "policy", "slice_ns", NULL};
    PyObject *offsets, *sources, *row_bytes;
    Py_ssize_t slots, threads;
    int policy = -1;
    long long slice_ns = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOnn|iL:GatherRing", names, &offsets, &sources, &row_bytes,
                                     &slots, &threads, &policy, &slice_ns))
        return NULL;
    if (slots < 1 || slots > RING_MAX_SLOTS || threads < 1 || threads > RING_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "slots must be in [1, %d] and threads in [1, %d], got %zd and %zd",
                     RING_MAX_SLOTS, RING_MAX_THREADS, slots, threads);
        return NULL;
    }
    if (policy != -1 && policy != 0 && policy != 3) {
        PyErr_Format(PyExc_ValueError, "policy must be -1 (unchanged), 0 or 3, not %d", policy);
        return NULL;
    }
    if (slice_ns < 0 || slice_ns > 100000000) {
        PyErr_Format(PyExc_ValueError, "slice_ns must be in [0, 1e8], got %lld", slice_ns);
        return NULL;
    }
    /* the offsets, validated as every gather validates them */
    Batch check;
    PyObject *none = PyBytes_FromStringAndSize(NULL, 0);
    if (none == NULL)
        return NULL;
    int bad = ch_batch_open(&check, none, offsets);
    Py_ssize_t nshards = check.nshards;
    Ring *r = NULL;
    if (bad)
        goto fail_check;
    if (!PyList_Check(sources) && !PyTuple_Check(sources)) {
        PyErr_SetString(PyExc_ValueError, "sources must be a list of per-column lists of per-shard buffers");
        goto fail_check;
    }
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(sources);
    PyObject *widths = PySequence_Tuple(row_bytes);
    if (widths == NULL || PyTuple_GET_SIZE(widths) != ncols || ncols < 1) {
        Py_XDECREF(widths);
        PyErr_Format(PyExc_ValueError, "row_bytes must give one width per column of sources (%zd, at least one)", ncols);
        goto fail_check;
    }
    r = (Ring *)type->tp_alloc(type, 0);
    if (r == NULL) {
        Py_DECREF(widths);
        goto fail_check;
    }
    r->policy = policy;
    r->slice_ns = slice_ns;
    r->awaited = -1;
    r->awaited_hi = -1;
    r->pid = getpid();
    r->ncols = ncols;
    r->nshards = nshards;
    r->nslots = slots;
    r->offsets = Py_NewRef(offsets);
    r->sources = PyMem_Calloc((size_t)ncols, sizeof(PyObject *));
    r->row_bytes = PyMem_Calloc((size_t)ncols, sizeof(int64_t));
    r->shard_rows = PyMem_Calloc((size_t)(nshards > 0 ? nshards : 1), sizeof(int64_t));
    r->held = PyMem_Calloc((size_t)(ncols * (nshards > 0 ? nshards : 1)), sizeof(Py_buffer));
    r->jobs = PyMem_Calloc((size_t)slots, sizeof(Job));
    r->queue = PyMem_Calloc((size_t)slots, sizeof(int64_t));
    if (r->sources == NULL || r->row_bytes == NULL || r->shard_rows == NULL || r->held == NULL || r->jobs == NULL ||
        r->queue == NULL) {
        Py_DECREF(widths);
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t s = 0; s < nshards; s++)
        r->shard_rows[s] = check.offsets[s + 1] - check.offsets[s];
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *column = PySequence_Fast_GET_ITEM(sources, c);
        if (ch_check_sources(column, nshards, "sources[c]") < 0 ||
            ch_int_arg(PyTuple_GET_ITEM(widths, c), 1, INT64_MAX, "row_bytes", &r->row_bytes[c]) < 0) {
            Py_DECREF(widths);
            goto fail;
        }
        r->sources[c] = Py_NewRef(column);
    }
    Py_DECREF(widths);
    ch_batch_close(&check);
    Py_DECREF(none);
    pthread_condattr_t attr;
    if (pthread_mutex_init(&r->mu, NULL) != 0 || pthread_condattr_init(&attr) != 0) {
        PyErr_SetString(PyExc_OSError, "GatherRing: cannot make its lock");
        Py_DECREF(r);
        return NULL;
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int made = pthread_cond_init(&r->work_cv, &attr) == 0 && pthread_cond_init(&r->done_cv, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (!made) {
        pthread_mutex_destroy(&r->mu);
        PyErr_SetString(PyExc_OSError, "GatherRing: cannot make its conditions");
        Py_DECREF(r);
        return NULL;
    }
    r->sync_made = 1;
    if (start_threads(r, (int)threads) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
fail:
    Py_DECREF(r);
fail_check:
    ch_batch_close(&check);
    Py_DECREF(none);
    return NULL;
}

/* With the GIL: the buffers of every column of the touched shards of `b`, exported once for the ring's life. */
static int take_shards(Ring *r, const Batch *b)
{
    PyObject *module = PyType_GetModule(Py_TYPE(r));
    for (Py_ssize_t j = 0; j < b->ntouched; j++) {
        Py_ssize_t shard = b->shard[b->order[j]];
        for (Py_ssize_t c = 0; c < r->ncols; c++) {
            Py_buffer *view = &r->held[c * r->nshards + shard];
            if (view->obj != NULL)
                continue;
            PyObject *item = ch_item_ref(r->sources[c], shard, "sources");
            if (item == NULL)
                return -1;
            if (item == Py_None) {
                Py_DECREF(item);
                ch_raise_unmapped(module, shard);
                return -1;
            }
            Py_buffer got;
            int bad = ch_byte_buffer(item, &got, 0, "sources");
            Py_DECREF(item);
            if (bad < 0)
                return -1;
            int64_t need;
            if (ch_mul_overflow(r->shard_rows[shard], r->row_bytes[c], &need) || got.len < need) {
                ch_raise_corrupt(module, shard, -1, "column %zd holds %zd bytes, too few for %lld rows of %lld bytes", c,
                                 got.len, (long long)r->shard_rows[shard], (long long)r->row_bytes[c]);
                ch_release(&got);
                return -1;
            }
            *view = got;
        }
    }
    return 0;
}

/* The prologue of submit and wait: `nargs` arguments, the first a step; the ring made by this process (and,
 * with `open`, not closed). -1 with the error set otherwise. */
static int step_args(Ring *r, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage, int open,
                     int64_t *step)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return -1;
    }
    if (ch_int_arg(args[0], 0, INT64_MAX, "step", step) < 0)
        return -1;
    if (r->pid != getpid() || (open && r->stop)) {
        PyErr_SetString(PyExc_RuntimeError, "this GatherRing was closed (or made by another process)");
        return -1;
    }
    return 0;
}

static PyObject *ring_submit(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t step;
    if (step_args(r, args, nargs, 3, "submit(step, indices, outs)", 1, &step) < 0)
        return NULL;
    Job *job = &r->jobs[step % r->nslots];
    pthread_mutex_lock(&r->mu);
    int state = job->state;
    int64_t held_step = job->step;
    if (state == JOB_FREE)
        job->state = JOB_FILLING;
    pthread_mutex_unlock(&r->mu);
    if (state != JOB_FREE) {
        PyErr_Format(PyExc_ValueError, "step %lld was submitted to place %lld, which still holds step %lld", (long long)step,
                     (long long)(step % r->nslots), (long long)held_step);
        return NULL;
    }
    job->step = step;
    PyObject *outs = NULL;
    if (ch_batch_open(&job->b, args[1], r->offsets) < 0 || ch_batch_resolve(&job->b) < 0 || take_shards(r, &job->b) < 0)
        goto fail;
    outs = PySequence_Tuple(args[2]);
    if (outs == NULL || PyTuple_GET_SIZE(outs) != r->ncols) {
        if (outs != NULL)
            PyErr_Format(PyExc_ValueError, "outs must hold one buffer per column (%zd), got %zd", r->ncols,
                         PyTuple_GET_SIZE(outs));
        goto fail;
    }
    const Batch *b = &job->b;
    job->outs = PyMem_Calloc((size_t)r->ncols, sizeof(Py_buffer));
    job->base = PyMem_Calloc((size_t)(r->ncols * (b->nslots > 0 ? b->nslots : 1)), sizeof(char *));
    if (job->outs == NULL || job->base == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        if (ch_byte_buffer(PyTuple_GET_ITEM(outs, c), &job->outs[c], 1, "outs") < 0)
            goto fail;
        int64_t need;
        if (ch_mul_overflow((int64_t)b->n, r->row_bytes[c], &need) || need != job->outs[c].len) {
            PyErr_Format(PyExc_ValueError, "outs[%zd] holds %zd bytes, needs %zd rows x %lld bytes", c, job->outs[c].len,
                         b->n, (long long)r->row_bytes[c]);
            goto fail;
        }
        for (Py_ssize_t k = 0; k < b->ntouched; k++) {
            Py_ssize_t slot = b->order[k];
            job->base[c * b->nslots + slot] = r->held[c * r->nshards + b->shard[slot]].buf;
        }
    }
    Py_DECREF(outs);
    pthread_mutex_lock(&r->mu);
    job->state = JOB_QUEUED;
    r->queue[(r->qhead + r->qlen) % r->nslots] = step;
    r->qlen++;
    pthread_cond_signal(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(outs);
    job_release(r, job);
    pthread_mutex_lock(&r->mu);
    job->state = JOB_FREE;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static PyObject *ring_wait(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t step;
    if (step_args(r, args, nargs, 2, "wait(step, timeout)", 0, &step) < 0)
        return NULL;
    double timeout = PyFloat_AsDouble(args[1]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    Job *job = &r->jobs[step % r->nslots];
    int state, timed_out = 0;
    pthread_mutex_lock(&r->mu);
    state = job->step == step ? job->state : JOB_FREE;
    pthread_mutex_unlock(&r->mu);
    if (state == JOB_FREE || state == JOB_FILLING) {
        PyErr_Format(PyExc_ValueError, "step %lld is not submitted", (long long)step);
        return NULL;
    }
    if (state != JOB_DONE) {
        struct timespec until;
        if (timeout >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &until);
            double whole = (double)(int64_t)timeout;
            int64_t ns = until.tv_nsec + (int64_t)((timeout - whole) * 1e9);
            until.tv_sec += (time_t)whole + (time_t)(ns / 1000000000);
            until.tv_nsec = (long)(ns % 1000000000);
        }
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&r->mu);
        while (job->step == step && (job->state == JOB_QUEUED || job->state == JOB_RUNNING) && !r->stop) {
            r->awaited = step;
            /* The steps after it that other threads are copying end about when it does: the loop, faster than the
             * copies (else it would not wait), would sleep again for each. One wake-up for them all. */
            int64_t hi = step;
            for (int64_t s = step + 1; s < step + r->want && s < step + r->nslots; s++) {
                const Job *o = &r->jobs[s % r->nslots];
                if (o->step != s || (o->state != JOB_RUNNING && o->state != JOB_DONE))
                    break;
                hi = s;
            }
            r->awaited_hi = hi;
            if (timeout < 0) {
                pthread_cond_wait(&r->done_cv, &r->mu);
            } else if (pthread_cond_timedwait(&r->done_cv, &r->mu, &until) == ETIMEDOUT) {
                timed_out = job->step == step && (job->state == JOB_QUEUED || job->state == JOB_RUNNING);
                break;
            }
        }
        r->awaited = -1;
        pthread_mutex_unlock(&r->mu);
        Py_END_ALLOW_THREADS
    }
    /* With the GIL again: the job is this waiter's only if it is still this step's, done (a drop or close
     * meanwhile took it); claimed (FILLING) while its resources are released. */
    pthread_mutex_lock(&r->mu);
    int mine = job->step == step && job->state == JOB_DONE;
    if (mine)
        job->state = JOB_FILLING;
    pthread_mutex_unlock(&r->mu);
    if (!mine) {
        if (timed_out) {
            PyErr_Format(PyExc_TimeoutError, "step %lld", (long long)step);
            return NULL;
        }
        Py_RETURN_NONE; /* dropped (drop or close) */
    }
    PyObject *result = Py_BuildValue("(LLL)", (long long)job->start_ns, (long long)job->end_ns, (long long)job->idle_ns);
    job_release(r, job);
    pthread_mutex_lock(&r->mu);
    job->state = JOB_FREE;
    pthread_mutex_unlock(&r->mu);
    return result;
}

static PyObject *ring_drop(Ring *r, PyObject *Py_UNUSED(ignored))
{
    if (r->pid != getpid() || !r->sync_made)
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    for (Py_ssize_t k = 0; k < r->qlen; k++) /* queued, never started: no worker will read them */
        r->jobs[r->queue[(r->qhead + k) % r->nslots] % r->nslots].state = JOB_FILLING;
    r->qlen = 0;
    r->dropping = 1;
    for (;;) { /* running ones finish (one batch's copy) */
        int running = 0;
        for (Py_ssize_t k = 0; k < r->nslots; k++)
            running |= r->jobs[k].state == JOB_RUNNING;
        if (!running || r->stop)
            break;
        pthread_cond_wait(&r->done_cv, &r->mu);
    }
    r->dropping = 0;
    for (int k = 0; k < r->nthreads; k++)
        r->workers[k].idle_since = -1; /* the time between passes is not the pool's idle time */
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    /* now nothing but this thread touches the jobs not free (a waiter sees them as not its own) */
    for (Py_ssize_t k = 0; k < r->nslots; k++) {
        Job *job = &r->jobs[k];
        if (job->state == JOB_FILLING || job->state == JOB_DONE) {
            pthread_mutex_lock(&r->mu);
            job->state = JOB_FILLING; /* a waiter for it sees it dropped */
            job->step = -1;
            pthread_cond_broadcast(&r->done_cv);
            pthread_mutex_unlock(&r->mu);
            job_release(r, job);
            pthread_mutex_lock(&r->mu);
            job->state = JOB_FREE;
            pthread_mutex_unlock(&r->mu);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *ring_count_done(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "count_done(first, limit) takes 2 arguments");
        return NULL;
    }
    int64_t first, limit;
    if (ch_int_arg(args[0], 0, INT64_MAX, "first", &first) < 0 || ch_int_arg(args[1], 0, INT64_MAX, "limit", &limit) < 0)
        return NULL;
    if (limit > r->nslots)
        limit = r->nslots;
    int64_t k = 0;
    if (r->pid == getpid()) {
        pthread_mutex_lock(&r->mu);
        while (k < limit) {
            const Job *job = &r->jobs[(first + k) % r->nslots];
            if (job->step != first + k || job->state != JOB_DONE)
                break;
            k++;
        }
        pthread_mutex_unlock(&r->mu);
    }
    return PyLong_FromLongLong(k);
}

static PyObject *ring_resize(Ring *r, PyObject *arg)
{
    int64_t threads;
    if (ch_int_arg(arg, 0, RING_MAX_THREADS, "threads", &threads) < 0)
        return NULL;
    if (r->pid != getpid() || r->stop) {
        PyErr_SetString(PyExc_RuntimeError, "this GatherRing was closed (or made by another process)");
        return NULL;
    }
    if (start_threads(r, (int)threads) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *ring_close(Ring *r, PyObject *Py_UNUSED(ignored))
{
    ring_stop(r);
    Py_RETURN_NONE;
}

static PyObject *ring_threads(Ring *r, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(r->stop ? 0 : r->want);
}

static PyObject *ring_slots(Ring *r, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(r->nslots);
}

static PyMethodDef ring_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))ring_submit, METH_FASTCALL,
     "submit(step, indices, outs): queue the gather of rows `indices` into `outs` (one buffer per column)."},
    {"wait", (PyCFunction)(void (*)(void))ring_wait, METH_FASTCALL,
     "wait(step, timeout) -> (start_ns, end_ns, idle_ns), or None if dropped; TimeoutError after timeout s (-1: for ever)."},
    {"drop", (PyCFunction)ring_drop, METH_NOARGS, "End a pass: drop queued jobs, let running ones finish, free all."},
    {"count_done", (PyCFunction)(void (*)(void))ring_count_done, METH_FASTCALL,
     "count_done(first, limit): how many steps from `first` in a row are done (at most limit and slots)."},
    {"resize", (PyCFunction)ring_resize, METH_O, "resize(threads): how many threads take jobs from now on (0: none; queued jobs wait)."},
    {"close", (PyCFunction)ring_close, METH_NOARGS, "Stop and join the threads; drop every job and shard buffer."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"threads", (getter)ring_threads, NULL, "Threads taking jobs.", NULL},
    {"slots", (getter)ring_slots, NULL, "Places for jobs: steps in flight at most.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ring_slots_spec[] = {
    {Py_tp_new, ring_new},
    {Py_tp_dealloc, ring_dealloc},
    {Py_tp_methods, ring_methods},
    {Py_tp_getset, ring_getset},
    {Py_tp_doc, "GatherRing(offsets, sources, row_bytes, slots, threads, policy=-1, slice_ns=0): gathers of fixed-size\n"
                "rows on native threads (see chute/_csrc/ring.c)."},
    {0, NULL},
};

static PyType_Spec ring_spec = {
    .name = "chute._native.GatherRing",
    .basicsize = sizeof(Ring),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = ring_slots_spec,
};

int ch_add_ring_type(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &ring_spec, NULL);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "GatherRing", type);
    Py_DECREF(type);
    return rc;
}
