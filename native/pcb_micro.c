/* Context-switch microbenchmarks: the native baselines of the context-switch study.
 * See pcb_micro.h for what each case times and what one operation is.
 *
 * Shape of a run: the caller's thread starts a driver thread pinned to cpu_a and waits for
 * it (in 100 ms slices, so a signal check can run, against a monotonic deadline).  The
 * driver blocks every signal, times the empty loop, then the case; threads and children it
 * makes inherit its CPU and its signal mask.  An abort (deadline, interrupt) sets a flag that
 * every loop checks at least once per CHUNK iterations and unblocks whatever could be
 * waiting: futex words, pipes, a child process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* as Python 3.9/3.10 pyconfig.h defines it, unguarded */
#endif
/* The setjmp/longjmp case jumps between two stacks on purpose.  With _FORTIFY_SOURCE, glibc
 * turns longjmp into __longjmp_chk, which aborts a jump to a frame that is not "up" the
 * current stack ("longjmp causes uninitialized stack frame") unless it lands on a
 * sigaltstack.  Build this file without it, whatever CFLAGS say. */
#undef _FORTIFY_SOURCE

#include "pcb_micro.h"
#include "pcb_time.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

/* A function that is really called: not inlined, not cloned, no facts about it used by its
 * callers (GCC's noipa), so the call instruction stays in the loop. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#define PCB_NOINLINE __attribute__((noinline, noipa))
#else
#define PCB_NOINLINE __attribute__((noinline))
#endif

/* An empty asm that claims to read and change x: the compiler must keep x, and every
 * iteration of a loop holding it, but no instruction is emitted. */
#define PCB_BARRIER(x) __asm__ volatile("" : "+r"(x))

/* Loops check the abort flag once per CHUNK iterations. */
#define CHUNK 65536u
/* The coroutine stacks of the setjmp/longjmp and swapcontext cases. */
#define CO_STACK_SIZE (256u * 1024u)
/* Threads of the sched_yield and usleep0 cases. */
#define SMALL_STACK_SIZE (64u * 1024u)
/* How often the waiting caller wakes to run the signal check. */
#define CHECK_INTERVAL_NS 100000000LL

typedef struct run {
    int index; /* the case */
    const pcb_micro_spec *spec;
    pcb_micro_result *res;
    atomic_int aborted;
    atomic_int word; /* futex_handoff: 0 the driver's turn, 1 the peer's, 2 aborted */
    atomic_int go;   /* thread cases: 0 wait, 1 go, 2 aborted */
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cond;
    int done;
    int fds[4];  /* two pipes: [0] <- [1] driver to peer, [2] <- [3] peer to driver; -1 closed */
    pid_t child; /* a child to SIGKILL on abort; 0 when none (or already reaped) */
    int err;
    char *errbuf;
    size_t errlen;
} run;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int aborted(run *r)
{
    return atomic_load_explicit(&r->aborted, memory_order_relaxed);
}

/* Records the first failure ("what: strerror(e)"); returns -1. */
static int fail(run *r, int e, const char *what)
{
    pthread_mutex_lock(&r->mu);
    if (!r->err) {
        r->err = e;
        snprintf(r->errbuf, r->errlen, "%s: %s", what, strerror(e));
    }
    pthread_mutex_unlock(&r->mu);
    return -1;
}

static long futex_wait(atomic_int *w, int val)
{
    return syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static long futex_wake(atomic_int *w, int n)
{
    return syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Starts a thread, pinned to cpu (>= 0) or inheriting the creator's CPUs (-1), with the
 * given stack size (0: the default). */
static int spawn(run *r, pthread_t *t, void *(*fn)(void *), void *arg, int cpu, size_t stack,
                 const char *what)
{
    pthread_attr_t attr;
    int e = pthread_attr_init(&attr);
    if (e)
        return fail(r, e, what);
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        e = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
    }
    if (!e && stack)
        e = pthread_attr_setstacksize(&attr, stack);
    if (!e)
        e = pthread_create(t, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return e ? fail(r, e, what) : 0;
}

/* Untimed round trips before a timed hand-off loop: a tenth of n, 10 .. 10000. */
static uint64_t warm_count(uint64_t n)
{
    uint64_t w = n / 10;
    return w < 10 ? 10 : w > 10000 ? 10000 : w;
}

/* for n iterations, checking the abort flag once per CHUNK */
#define TIMED_LOOP(r, n, body)                                                                 \
    for (uint64_t done_ = 0; done_ < (n) && !aborted(r);) {                                    \
        uint64_t m_ = (n)-done_ < CHUNK ? (n)-done_ : CHUNK;                                   \
        for (uint64_t i_ = 0; i_ < m_; i_++) {                                                 \
            body;                                                                              \
        }                                                                                      \
        done_ += m_;                                                                           \
    }

/* ---- the empty loop ---------------------------------------------------------------- */

PCB_NOINLINE static int64_t micro_empty_loop(run *r, uint64_t n)
{
    uint64_t acc = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, {
        acc++;
        PCB_BARRIER(acc);
    });
    int64_t t = now_ns() - t0;
    PCB_BARRIER(acc);
    return t;
}

/* ---- function call and syscall ------------------------------------------------------ */

/* The callee: its body is the empty loop's body (a barrier and an add), so the difference
 * between the two loops is the call and the return.  tests/test_micro.py checks that the
 * disassembly of micro_call_loop holds a `call micro_callee`, that check == n, and that the
 * time grows with n. */
PCB_NOINLINE static uint64_t micro_callee(uint64_t x)
{
    PCB_BARRIER(x);
    return x + 1;
}

PCB_NOINLINE static int micro_call_loop(run *r, uint64_t n, pcb_micro_result *res)
{
    uint64_t acc = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, acc = micro_callee(acc));
    res->elapsed_ns = now_ns() - t0;
    res->ops = n;
    res->check = acc;
    return 0;
}

static int case_call(run *r, uint64_t n, pcb_micro_result *res)
{
    return micro_call_loop(r, n, res);
}

static int case_syscall_getpid(run *r, uint64_t n, pcb_micro_result *res)
{
    long me = (long)getpid();
    uint64_t same = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, same += (syscall(SYS_getpid) == me));
    res->elapsed_ns = now_ns() - t0;
    res->ops = n;
    res->check = same;
    return 0;
}

/* ---- coroutine stacks ---------------------------------------------------------------- */

/* A stack for a coroutine, with an inaccessible guard page below it. */
static void *stack_alloc(run *r, size_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, size + (size_t)page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) {
        fail(r, errno, "mmap coroutine stack");
        return NULL;
    }
    if (mprotect(p, (size_t)page, PROT_NONE) != 0) {
        fail(r, errno, "mprotect guard page");
        munmap(p, size + (size_t)page);
        return NULL;
    }
    return (char *)p + page;
}

static void stack_free(void *stack, size_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    munmap((char *)stack - page, size + (size_t)page);
}


/* Allocates a coroutine stack and prepares uc to start entry on it (the coroutine never
 * returns: uc_link is NULL).  Returns the stack, or NULL after fail() with nothing left
 * allocated. */
static void *co_prepare(run *r, ucontext_t *uc, void (*entry)(void))
{
    void *stack = stack_alloc(r, CO_STACK_SIZE);
    if (!stack)
        return NULL;
    if (getcontext(uc) != 0) {
        int e = errno;
        stack_free(stack, CO_STACK_SIZE);
        fail(r, e, "getcontext");
        return NULL;
    }
    uc->uc_stack.ss_sp = stack;
    uc->uc_stack.ss_size = CO_STACK_SIZE;
    uc->uc_link = NULL;
    makecontext(uc, entry, 0);
    return stack;
}

/* ---- setjmp/longjmp between two stacks ----------------------------------------------
 *
 * How the second stack is made: once, with getcontext/makecontext/swapcontext (the
 * portable alternative, when ucontext is missing, is Engelschall's: a signal handler run
 * on a sigaltstack does the first setjmp there).  The coroutine's first act on its own stack
 * is to _setjmp its place and _longjmp back; from then on every switch either way is one
 * _setjmp (save here) and one _longjmp (resume there): no system call, since _setjmp does
 * not save the signal mask.  Each side's jmp_buf points into a frame that stays alive on its
 * own stack while the other side runs, which is what makes this a real switch and not an
 * unwind.  One op = a round trip: main -> coroutine (which counts it) -> main. */

typedef struct jmp_co {
    jmp_buf main_jb, co_jb;
    ucontext_t main_uc, co_uc;
    uint64_t count;
} jmp_co;

static _Thread_local jmp_co *tls_jmp;

static void micro_jmp_co_entry(void)
{
    for (;;) {
        if (!_setjmp(tls_jmp->co_jb))
            _longjmp(tls_jmp->main_jb, 1);
        tls_jmp->count++;
    }
}

/* Enters the coroutine for the first time: it saves its place and jumps back here. */
PCB_NOINLINE static void micro_jmp_start(jmp_co *s)
{
    if (!_setjmp(s->main_jb))
        swapcontext(&s->main_uc, &s->co_uc);
}

/* One switch there and back. */
PCB_NOINLINE static void micro_jmp_to_co(jmp_co *s)
{
    if (!_setjmp(s->main_jb))
        _longjmp(s->co_jb, 1);
}

static int case_setjmp_longjmp(run *r, uint64_t n, pcb_micro_result *res)
{
    jmp_co *s = calloc(1, sizeof(*s));
    if (!s)
        return fail(r, ENOMEM, "calloc");
    void *stack = co_prepare(r, &s->co_uc, micro_jmp_co_entry);
    if (!stack) {
        free(s);
        return -1;
    }
    tls_jmp = s;
    micro_jmp_start(s);
    for (uint64_t i = 0; i < warm_count(n); i++)
        micro_jmp_to_co(s);
    s->count = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, micro_jmp_to_co(s));
    res->elapsed_ns = now_ns() - t0;
    res->ops = n;
    res->check = s->count;
    /* The coroutine stays suspended in its _setjmp: nothing on its stack needs unwinding. */
    tls_jmp = NULL;
    free(s);
    stack_free(stack, CO_STACK_SIZE);
    return 0;
}

/* ---- swapcontext ping-pong ----------------------------------------------------------
 * One op = a round trip: two swapcontext calls, each of which also sets the signal mask
 * (rt_sigprocmask, a system call, in glibc). */

typedef struct uc_co {
    ucontext_t main_uc, co_uc;
    uint64_t count;
} uc_co;

static _Thread_local uc_co *tls_uc;

static void micro_uc_entry(void)
{
    for (;;) {
        tls_uc->count++;
        swapcontext(&tls_uc->co_uc, &tls_uc->main_uc);
    }
}

static int case_swapcontext(run *r, uint64_t n, pcb_micro_result *res)
{
    uc_co *s = calloc(1, sizeof(*s));
    if (!s)
        return fail(r, ENOMEM, "calloc");
    void *stack = co_prepare(r, &s->co_uc, micro_uc_entry);
    if (!stack) {
        free(s);
        return -1;
    }
    tls_uc = s;
    for (uint64_t i = 0; i < warm_count(n); i++)
        swapcontext(&s->main_uc, &s->co_uc);
    s->count = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, swapcontext(&s->main_uc, &s->co_uc));
    res->elapsed_ns = now_ns() - t0;
    res->ops = n;
    res->check = s->count;
    tls_uc = NULL;
    free(s);
    stack_free(stack, CO_STACK_SIZE);
    return 0;
}

/* ---- a minimal portable coroutine: stackless, no assembly ----------------------------
 * The protothreads technique (Duff's device): the coroutine's resume point is a `case`
 * label inside its loop, its state a struct instead of a stack.  Resuming is a call and a
 * jump through the switch; yielding is a return.  Plain C, any compiler, no stack to switch
 * (like a Python generator, whose frame lives on the heap); a stackful switch without
 * assembly is the setjmp/longjmp case above.  One op = resume until the next yield. */

typedef struct micro_co {
    int state;
    uint64_t count;
} micro_co;

PCB_NOINLINE static int micro_co_resume(micro_co *co)
{
    switch (co->state) {
    case 0:
        for (;;) {
            co->count++;
            co->state = 1;
            return 1; /* yield */
    case 1:;         /* resumed here */
        }
    }
    return 0;
}

static int case_coroutine(run *r, uint64_t n, pcb_micro_result *res)
{
    micro_co co = {0, 0};
    for (uint64_t i = 0; i < warm_count(n); i++)
        micro_co_resume(&co);
    co.count = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, micro_co_resume(&co));
    res->elapsed_ns = now_ns() - t0;
    res->ops = n;
    res->check = co.count;
    return 0;
}

/* ---- mutexes ------------------------------------------------------------------------ */

static int case_mutex_uncontended(run *r, uint64_t n, pcb_micro_result *res)
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    uint64_t count = 0;
    int64_t t0 = now_ns();
    TIMED_LOOP(r, n, {
        pthread_mutex_lock(&m);
        count++;
        pthread_mutex_unlock(&m);
    });
    res->elapsed_ns = now_ns() - t0;
    res->ops = n;
    res->check = count;
    pthread_mutex_destroy(&m);
    return 0;
}

typedef struct mparty {
    run *r;
    pthread_mutex_t *m;
    uint64_t *counter;
    uint64_t k;
    int64_t start, end;
} mparty;

/* Waits for the start flag (futex, not a spin: the parties may share one CPU). */
static int wait_go(run *r)
{
    int v;
    while ((v = atomic_load_explicit(&r->go, memory_order_acquire)) == 0)
        futex_wait(&r->go, 0);
    return v == 1 ? 0 : -1;
}

static void release_go(run *r, int value)
{
    int expect = 0;
    atomic_compare_exchange_strong(&r->go, &expect, value);
    futex_wake(&r->go, INT_MAX);
}

static void *mutex_party(void *p)
{
    mparty *a = p;
    if (wait_go(a->r) != 0)
        return NULL;
    a->start = now_ns();
    TIMED_LOOP(a->r, a->k, {
        pthread_mutex_lock(a->m);
        (*a->counter)++;
        pthread_mutex_unlock(a->m);
    });
    a->end = now_ns();
    return NULL;
}

static int case_mutex_contended(run *r, uint64_t n, pcb_micro_result *res)
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    uint64_t counter = 0;
    mparty p[2];
    pthread_t t[2];
    int cpus[2] = {r->spec->cpu_a, r->spec->cpu_b};
    int started = 0;
    for (int i = 0; i < 2; i++) {
        p[i] = (mparty){r, &m, &counter, (n + 1) / 2, 0, 0};
        if (spawn(r, &t[i], mutex_party, &p[i], cpus[i], 0, "pthread_create") != 0)
            break;
        started++;
    }
    release_go(r, started == 2 ? 1 : 2);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    pthread_mutex_destroy(&m);
    if (started < 2)
        return -1;
    int64_t start = p[0].start < p[1].start ? p[0].start : p[1].start;
    int64_t end = p[0].end > p[1].end ? p[0].end : p[1].end;
    res->elapsed_ns = end - start;
    res->ops = 2 * ((n + 1) / 2);
    res->check = counter;
    return 0;
}

/* ---- sched_yield and usleep(0) with many threads ------------------------------------- */

typedef struct worker {
    run *r;
    int sleep; /* 0: sched_yield, 1: usleep(0) */
    uint64_t k, done;
    int64_t start, end;
} worker;

static void *yield_worker(void *p)
{
    worker *w = p;
    if (wait_go(w->r) != 0)
        return NULL;
    w->start = now_ns();
    uint64_t done = 0;
    if (w->sleep) {
        for (; done < w->k && !aborted(w->r); done++)
            usleep(0);
    } else {
        for (; done < w->k && !aborted(w->r); done++)
            sched_yield();
    }
    w->end = now_ns();
    w->done = done;
    return NULL;
}

/* n ops shared by spec->threads threads, all on the driver's CPU; timed from the first
 * thread's start to the last one's end. */
static int yield_case(run *r, uint64_t n, pcb_micro_result *res, int sleep)
{
    uint32_t nt = r->spec->threads;
    uint64_t k = n / nt ? n / nt : 1;
    worker *w = calloc(nt, sizeof(*w));
    pthread_t *t = calloc(nt, sizeof(*t));
    if (!w || !t) {
        free(w);
        free(t);
        return fail(r, ENOMEM, "calloc");
    }
    uint32_t started = 0;
    for (; started < nt; started++) {
        w[started] = (worker){r, sleep, k, 0, 0, 0};
        if (spawn(r, &t[started], yield_worker, &w[started], -1, SMALL_STACK_SIZE,
                  "pthread_create") != 0)
            break;
    }
    release_go(r, started == nt ? 1 : 2);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    int rc = 0;
    if (started < nt) {
        rc = -1;
    } else {
        int64_t start = w[0].start, end = w[0].end;
        uint64_t ops = 0;
        for (uint32_t i = 0; i < nt; i++) {
            start = w[i].start < start ? w[i].start : start;
            end = w[i].end > end ? w[i].end : end;
            ops += w[i].done;
        }
        res->elapsed_ns = end - start;
        res->ops = (uint64_t)nt * k;
        res->check = ops;
    }
    free(w);
    free(t);
    return rc;
}

static int case_sched_yield(run *r, uint64_t n, pcb_micro_result *res)
{
    return yield_case(r, n, res, 0);
}

static int case_usleep0(run *r, uint64_t n, pcb_micro_result *res)
{
    return yield_case(r, n, res, 1);
}

/* ---- creating threads and processes -------------------------------------------------- */

static void *noop_thread(void *p)
{
    atomic_fetch_add_explicit((atomic_ullong *)p, 1, memory_order_relaxed);
    return NULL;
}

static int case_pthread_create_join(run *r, uint64_t n, pcb_micro_result *res)
{
    atomic_ullong count = 0;
    pthread_t t;
    for (uint64_t i = 0; i < warm_count(n) / 10 + 1; i++) {
        int e = pthread_create(&t, NULL, noop_thread, &count);
        if (e)
            return fail(r, e, "pthread_create");
        pthread_join(t, NULL);
    }
    atomic_store(&count, 0);
    uint64_t i = 0;
    int64_t t0 = now_ns();
    for (; i < n && !aborted(r); i++) {
        int e = pthread_create(&t, NULL, noop_thread, &count);
        if (e)
            return fail(r, e, "pthread_create");
        pthread_join(t, NULL);
    }
    res->elapsed_ns = now_ns() - t0;
    res->ops = i;
    res->check = atomic_load(&count);
    return 0;
}

/* fork + waitpid of a child that exits at once; returns 1 when it exited 0, 0 otherwise,
 * -1 when fork failed. */
static int fork_one(run *r)
{
    pid_t pid = fork();
    if (pid < 0)
        return fail(r, errno, "fork");
    if (pid == 0)
        _exit(0);
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR)
            return fail(r, errno, "waitpid");
    }
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int case_fork_waitpid(run *r, uint64_t n, pcb_micro_result *res)
{
    for (uint64_t i = 0; i < warm_count(n) / 10 + 1; i++) {
        if (fork_one(r) < 0)
            return -1;
    }
    uint64_t ok = 0, i = 0;
    int64_t t0 = now_ns();
    for (; i < n && !aborted(r); i++) {
        int v = fork_one(r);
        if (v < 0)
            return -1;
        ok += (uint64_t)v;
    }
    res->elapsed_ns = now_ns() - t0;
    res->ops = i;
    res->check = ok;
    return 0;
}

/* ---- two-party hand-offs ------------------------------------------------------------- */

typedef struct peer {
    run *r;
    uint64_t total; /* round trips to answer, warm-up included */
    uint64_t count; /* answered */
} peer;

/* futex: the turn word goes 0 -> 1 (driver hands over, wakes the peer) and 1 -> 0 (the peer
 * hands back); both with compare-and-swap, so an abort's 2 is never overwritten. */
static void *futex_peer(void *p)
{
    peer *b = p;
    run *r = b->r;
    for (uint64_t i = 0; i < b->total; i++) {
        int v;
        while ((v = atomic_load_explicit(&r->word, memory_order_acquire)) == 0)
            futex_wait(&r->word, 0);
        if (v != 1)
            break;
        b->count++;
        int expect = 1;
        if (!atomic_compare_exchange_strong(&r->word, &expect, 0))
            break;
        futex_wake(&r->word, 1);
    }
    return NULL;
}

static inline int futex_round(run *r)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&r->word, &expect, 1))
        return -1;
    futex_wake(&r->word, 1);
    int v;
    while ((v = atomic_load_explicit(&r->word, memory_order_acquire)) == 1)
        futex_wait(&r->word, 1);
    return v == 0 ? 0 : -1;
}

static int case_futex_handoff(run *r, uint64_t n, pcb_micro_result *res)
{
    uint64_t warm = warm_count(n);
    peer b = {r, warm + n, 0};
    pthread_t t;
    atomic_store(&r->word, 0);
    if (spawn(r, &t, futex_peer, &b, r->spec->cpu_b, 0, "pthread_create") != 0)
        return -1;
    int rc = 0;
    for (uint64_t i = 0; i < warm && rc == 0; i++)
        rc = futex_round(r);
    uint64_t before = b.count; /* stable: the peer waits for the next turn */
    int64_t t0 = now_ns();
    uint64_t i = 0;
    if (rc == 0) {
        TIMED_LOOP(r, n, {
            if (futex_round(r) != 0)
                goto out;
            i++;
        });
    }
out:
    res->elapsed_ns = now_ns() - t0;
    if (i < n) { /* aborted, or the peer is gone: make sure it stops */
        atomic_store(&r->word, 2);
        futex_wake(&r->word, INT_MAX);
    }
    pthread_join(t, NULL);
    res->ops = 2 * i;
    res->check = b.count - before;
    return 0;
}

/* pipes: the driver writes a byte (the round trip's number, mod 256), the peer reads it and
 * writes it back, the driver reads it and checks it.  check = verified round trips. */
static int open_pipes(run *r)
{
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC) != 0)
        return fail(r, errno, "pipe");
    if (pipe2(b, O_CLOEXEC) != 0) {
        int e = errno;
        close(a[0]);
        close(a[1]);
        return fail(r, e, "pipe");
    }
    pthread_mutex_lock(&r->mu);
    r->fds[0] = a[0];
    r->fds[1] = a[1];
    r->fds[2] = b[0];
    r->fds[3] = b[1];
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void close_fd(run *r, int i)
{
    pthread_mutex_lock(&r->mu);
    if (r->fds[i] >= 0)
        close(r->fds[i]);
    r->fds[i] = -1;
    pthread_mutex_unlock(&r->mu);
}

static int read1(int fd, unsigned char *c)
{
    ssize_t k;
    while ((k = read(fd, c, 1)) < 0 && errno == EINTR)
        ;
    return k == 1 ? 0 : -1;
}

static int write1(int fd, unsigned char c)
{
    ssize_t k;
    while ((k = write(fd, &c, 1)) < 0 && errno == EINTR)
        ;
    return k == 1 ? 0 : -1;
}

/* The echoing side: reads `total` bytes from in, writes each back to out.  Async-signal-safe
 * (it also runs in a forked child).  Returns the bytes echoed. */
static uint64_t pipe_echo(run *r, int in, int out, uint64_t total)
{
    uint64_t i = 0;
    unsigned char c;
    for (; i < total; i++) {
        if (read1(in, &c) != 0 || aborted(r) || write1(out, c) != 0)
            break;
    }
    return i;
}

static void *pipe_peer(void *p)
{
    peer *b = p;
    b->count = pipe_echo(b->r, b->r->fds[0], b->r->fds[3], b->total);
    return NULL;
}

/* One round trip from the driver's side; -1 when the peer is gone or the run aborted. */
static inline int pipe_round(run *r, int out, int in, uint64_t i)
{
    unsigned char c;
    if (write1(out, (unsigned char)i) != 0 || read1(in, &c) != 0)
        return -1;
    return c == (unsigned char)i && !aborted(r) ? 0 : -1;
}

/* The driver's side of a pipe ping-pong: warm-up, then n timed round trips. */
static void pipe_driver(run *r, uint64_t n, pcb_micro_result *res)
{
    int out = r->fds[1], in = r->fds[2];
    uint64_t warm = warm_count(n), i = 0;
    int rc = 0;
    for (uint64_t w = 0; w < warm && rc == 0; w++)
        rc = pipe_round(r, out, in, w);
    int64_t t0 = now_ns();
    if (rc == 0) {
        TIMED_LOOP(r, n, {
            if (pipe_round(r, out, in, i) != 0)
                goto out;
            i++;
        });
    }
out:
    res->elapsed_ns = now_ns() - t0;
    res->ops = 2 * i;
    res->check = i;
}

static int case_pipe_threads(run *r, uint64_t n, pcb_micro_result *res)
{
    if (open_pipes(r) != 0)
        return -1;
    peer b = {r, warm_count(n) + n, 0};
    pthread_t t;
    int rc = spawn(r, &t, pipe_peer, &b, r->spec->cpu_b, 0, "pthread_create");
    if (rc == 0) {
        pipe_driver(r, n, res);
        close_fd(r, 1); /* the peer reads EOF if it still waits */
        pthread_join(t, NULL);
    }
    for (int i = 0; i < 4; i++)
        close_fd(r, i);
    return rc;
}

static int case_pipe_processes(run *r, uint64_t n, pcb_micro_result *res)
{
    if (open_pipes(r) != 0)
        return -1;
    uint64_t total = warm_count(n) + n;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        for (int i = 0; i < 4; i++)
            close_fd(r, i);
        return fail(r, e, "fork");
    }
    if (pid == 0) {
        /* The child: only async-signal-safe calls from here to _exit. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        if (r->spec->cpu_b >= 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(r->spec->cpu_b, &set);
            sched_setaffinity(0, sizeof(set), &set);
        }
        close(r->fds[1]);
        close(r->fds[2]);
        _exit(pipe_echo(r, r->fds[0], r->fds[3], total) == total ? 0 : 1);
    }
    pthread_mutex_lock(&r->mu);
    r->child = pid;
    pthread_mutex_unlock(&r->mu);
    close_fd(r, 0); /* the child's ends: so its death is EOF here */
    close_fd(r, 3);
    pipe_driver(r, n, res);
    close_fd(r, 1); /* the child reads EOF if it still waits */
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&r->mu);
    r->child = 0;
    pthread_mutex_unlock(&r->mu);
    close_fd(r, 2);
    if (!aborted(r) && res->check == n && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        return fail(r, ECHILD, "the echoing child failed");
    return 0;
}

/* ---- the case table ------------------------------------------------------------------ */

/* X(name, two_party, threaded) */
#define PCB_MICRO_CASES(X)                                                                     \
    X(call, 0, 0)                                                                              \
    X(syscall_getpid, 0, 0)                                                                    \
    X(setjmp_longjmp, 0, 0)                                                                    \
    X(swapcontext, 0, 0)                                                                       \
    X(coroutine, 0, 0)                                                                         \
    X(mutex_uncontended, 0, 0)                                                                 \
    X(mutex_contended, 1, 0)                                                                   \
    X(sched_yield, 0, 1)                                                                       \
    X(usleep0, 0, 1)                                                                           \
    X(pthread_create_join, 0, 0)                                                               \
    X(fork_waitpid, 0, 0)                                                                      \
    X(futex_handoff, 1, 0)                                                                     \
    X(pipe_threads, 1, 0)                                                                      \
    X(pipe_processes, 1, 0)

typedef int (*case_fn)(run *r, uint64_t n, pcb_micro_result *res);

static const struct {
    case_fn fn;
    int two_party, threaded;
} CASES[] = {
#define X(name, two, thr) {case_##name, two, thr},
    PCB_MICRO_CASES(X)
#undef X
};

#define CASE_COUNT ((int)(sizeof(CASES) / sizeof(CASES[0])))

const char *const pcb_micro_names[] = {
#define X(name, two, thr) #name,
    PCB_MICRO_CASES(X)
#undef X
    NULL,
};

int pcb_micro_find(const char *name)
{
    for (int i = 0; i < CASE_COUNT; i++) {
        if (strcmp(pcb_micro_names[i], name) == 0)
            return i;
    }
    return -1;
}

int pcb_micro_two_party(int index)
{
    return index >= 0 && index < CASE_COUNT ? CASES[index].two_party : 0;
}

int pcb_micro_threaded(int index)
{
    return index >= 0 && index < CASE_COUNT ? CASES[index].threaded : 0;
}

/* ---- driver and caller --------------------------------------------------------------- */

/* Nanoseconds the calling thread has spent runnable but waiting for a CPU (the second field
 * of its schedstat), or -1 when /proc does not say. */
static int64_t run_delay_ns(void)
{
    char buf[128];
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t k = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (k <= 0)
        return -1;
    buf[k] = '\0';
    unsigned long long run, wait;
    if (sscanf(buf, "%llu %llu", &run, &wait) != 2)
        return -1;
    return (int64_t)wait;
}

static void *driver_main(void *p)
{
    run *r = p;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    r->res->empty_ns = micro_empty_loop(r, r->spec->n);
    int64_t w0 = run_delay_ns();
    int rc = CASES[r->index].fn(r, r->spec->n, r->res);
    int64_t w1 = run_delay_ns();
    r->res->waited_ns = w0 >= 0 && w1 >= w0 ? w1 - w0 : -1;
    if (rc == 0 && aborted(r))
        fail(r, ETIMEDOUT, "aborted");
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Stops a run: the reason first (so it is the error reported), then everything that could
 * be waiting is woken. */
static void abort_run(run *r, int e, const char *why)
{
    pthread_mutex_lock(&r->mu);
    if (!r->err) {
        r->err = e;
        snprintf(r->errbuf, r->errlen, "%s", why);
    }
    atomic_store(&r->aborted, 1);
    atomic_store(&r->word, 2);
    futex_wake(&r->word, INT_MAX);
    int expect = 0;
    atomic_compare_exchange_strong(&r->go, &expect, 2);
    futex_wake(&r->go, INT_MAX);
    if (r->fds[1] >= 0)
        (void)!write(r->fds[1], "x", 1);
    if (r->fds[3] >= 0)
        (void)!write(r->fds[3], "x", 1);
    if (r->child > 0)
        kill(r->child, SIGKILL);
    pthread_mutex_unlock(&r->mu);
}

static int cpu_allowed(int cpu, const cpu_set_t *allowed)
{
    return cpu == -1 || (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, allowed));
}

int pcb_micro_run(int index, const pcb_micro_spec *spec, pcb_micro_result *res,
                  pcb_micro_check_fn check, void *arg, char *err, size_t errlen)
{
    cpu_set_t allowed;
    const char *bad = NULL;
    if (errlen)
        err[0] = '\0';
    if (index < 0 || index >= CASE_COUNT)
        bad = "case: unknown";
    else if (spec->n < 1 || spec->n > PCB_MICRO_MAX_N)
        bad = "n: must be 1 .. 4e9";
    else if (spec->threads < 1 || spec->threads > PCB_MICRO_MAX_THREADS ||
             (!CASES[index].threaded && spec->threads != 1))
        bad = "threads: must be 1, or 1 .. 4096 for sched_yield and usleep0";
    else if (!(spec->timeout > 0) || !isfinite(spec->timeout))
        bad = "timeout: must be > 0 seconds";
    else if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        bad = "sched_getaffinity failed";
    else if (!cpu_allowed(spec->cpu_a, &allowed) || !cpu_allowed(spec->cpu_b, &allowed))
        bad = "cpu_a, cpu_b: not a CPU this process may run on";
    if (bad) {
        snprintf(err, errlen, "%s", bad);
        errno = EINVAL;
        return -1;
    }
    if (errlen < 64) {
        errno = EINVAL;
        return -1;
    }

    memset(res, 0, sizeof(*res));
    run r;
    memset(&r, 0, sizeof(r));
    r.index = index;
    r.spec = spec;
    r.res = res;
    r.errbuf = err;
    r.errlen = errlen;
    for (int i = 0; i < 4; i++)
        r.fds[i] = -1;
    atomic_init(&r.aborted, 0);
    atomic_init(&r.word, 0);
    atomic_init(&r.go, 0);
    pthread_mutex_init(&r.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.cond, &ca);
    pthread_condattr_destroy(&ca);

    int64_t deadline = pcb_ns_after(now_ns(), spec->timeout);
    pthread_t driver;
    int rc = spawn(&r, &driver, driver_main, &r, spec->cpu_a, 0, "pthread_create driver");
    if (rc == 0) {
        int why = 0;
        pthread_mutex_lock(&r.mu);
        while (!r.done) {
            int64_t t = now_ns();
            if (t >= deadline) {
                why = ETIMEDOUT;
                break;
            }
            int64_t until = deadline < t + CHECK_INTERVAL_NS ? deadline : t + CHECK_INTERVAL_NS;
            struct timespec ts = {until / 1000000000LL, until % 1000000000LL};
            pthread_cond_timedwait(&r.cond, &r.mu, &ts);
            if (!r.done && check) {
                pthread_mutex_unlock(&r.mu);
                int stop = check(arg);
                pthread_mutex_lock(&r.mu);
                if (stop && !r.done) {
                    why = EINTR;
                    break;
                }
            }
        }
        pthread_mutex_unlock(&r.mu);
        if (why == ETIMEDOUT) {
            char msg[96];
            snprintf(msg, sizeof(msg), "%s: not finished within %g s", pcb_micro_names[index],
                     spec->timeout);
            abort_run(&r, ETIMEDOUT, msg);
        } else if (why == EINTR) {
            abort_run(&r, EINTR, "interrupted");
        }
        pthread_join(driver, NULL);
    }
    pthread_cond_destroy(&r.cond);
    pthread_mutex_destroy(&r.mu);
    if (r.err) {
        errno = r.err;
        return -1;
    }
    return 0;
}
