/* The scheduling class and time slice of the calling thread (Linux): batch work that yields to the training loop. */
#include "native.h"

#if defined(__linux__)
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
/* The kernel's struct sched_attr as of its first version (SCHED_ATTR_SIZE_VER0: 48 bytes), declared here because
 * libc headers before glibc 2.41 do not. */
typedef struct {
    uint32_t size;
    uint32_t policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime; /* for the fair classes (Linux 6.12+): the thread's slice in ns; 0 = the default */
    uint64_t deadline;
    uint64_t period;
} SchedAttr;

#define CH_RESET_ON_FORK 0x01
#endif

int ch_set_thread_class(int policy, int64_t slice_ns)
{
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
    SchedAttr attr;
    memset(&attr, 0, sizeof attr);
    /* the thread's nice value stays (the legacy sched_setscheduler keeps it too): raising it back to 0 from a
     * process started under nice would need a privilege */
    if (syscall(SYS_sched_getattr, 0, &attr, (unsigned)sizeof attr, 0u) != 0)
        return 0;
    attr.size = (uint32_t)sizeof attr;
    attr.policy = (uint32_t)policy;
    attr.flags &= CH_RESET_ON_FORK;
    attr.priority = 0;
    attr.runtime = (uint64_t)slice_ns; /* kernels before 6.12 ignore it for the fair classes */
    attr.deadline = attr.period = 0;
    if (syscall(SYS_sched_setattr, 0, &attr, 0u) != 0) {
        /* a sandbox that forbids it (seccomp: EPERM/ENOSYS), or a thread that may not leave its class (SCHED_IDLE
         * without the privilege): the thread's class stays as it was */
        errno = 0;
        return 0;
    }
    return 1;
#else
    (void)policy;
    (void)slice_ns;
    return 0;
#endif
}

PyObject *ch_thread_class(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"policy", "slice_ns", NULL};
    PyObject *a[2];
    if (ch_parse_args("thread_class", args, nargs, kwnames, names, 2, a) < 0)
        return NULL;
    int64_t policy, slice_ns;
    /* 0 (SCHED_OTHER) and 3 (SCHED_BATCH) only: the fair classes, which need no privilege */
    if (ch_int_arg(a[0], 0, 3, "policy", &policy) < 0 || ch_int_arg(a[1], 0, 100000000, "slice_ns", &slice_ns) < 0)
        return NULL;
    if (policy != 0 && policy != 3) {
        PyErr_Format(PyExc_ValueError, "policy must be 0 (SCHED_OTHER) or 3 (SCHED_BATCH), not %lld", (long long)policy);
        return NULL;
    }
    return PyBool_FromLong(ch_set_thread_class((int)policy, slice_ns));
}
