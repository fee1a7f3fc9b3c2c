/* Native echo servers: the C baselines every Python model is compared with (see pcb_echo.h).
 *
 * pcb_echo_epoll: one thread, level-triggered epoll, one malloc'd 64 KiB buffer per
 * connection, strict read-then-write-back with backpressure (no read while echoed bytes are
 * pending).  pcb_echo_threads: one detached, signal-blocked thread per connection doing
 * blocking recv/send.  Neither prints, neither closes listen_fd or stop_fd, and both put
 * listen_fd's file status flags back as they found them before returning.
 */
#define _GNU_SOURCE
#include "pcb_echo.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EPOLL_BUF_SIZE (64 * 1024)    /* per connection, pcb_echo_epoll */
#define THREAD_BUF_SIZE (16 * 1024)   /* on each worker's stack, pcb_echo_threads */
#define THREAD_STACK_DEFAULT (64 * 1024)
#define EPOLL_MAX_EVENTS 256
#define ACCEPT_PAUSE_MS 10            /* after EMFILE/ENFILE/ENOBUFS/ENOMEM on accept */
#define POLL_TIMEOUT_MS 1000

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                             */

static void set_err(char *err, size_t errlen, const char *what, int e)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s: %s", what, strerror(e));
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 1 when fd is an AF_INET/AF_INET6 socket (so TCP_NODELAY applies), else 0. */
static int is_inet_socket(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return 0;
    return ss.ss_family == AF_INET || ss.ss_family == AF_INET6;
}

static void set_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  /* best effort */
}

/* Makes fd non-blocking.  Returns its previous file status flags, or -1 with errno set. */
static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0)
        return -1;
    if (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return -1;
    return flags;
}

static void restore_flags(int fd, int flags)
{
    int saved = errno;
    if (!(flags & O_NONBLOCK))
        (void)fcntl(fd, F_SETFL, flags);
    errno = saved;
}

/* accept4 failures that are about one aborted incoming connection (Linux passes pending
 * network errors to accept): skip it and go on accepting. */
static int accept_error_is_transient(int e)
{
    switch (e) {
    case ECONNABORTED: case EPROTO: case EPERM: case ENETDOWN: case ENOPROTOOPT:
    case EHOSTDOWN: case ENONET: case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
    case ETIMEDOUT:
        return 1;
    default:
        return 0;
    }
}

/* A peer going away (EOF aside): not counted as an error. */
static int error_is_quiet(int e)
{
    return e == ECONNRESET || e == EPIPE;
}

/* ------------------------------------------------------------------------------------------ */
/* pcb_echo_epoll                                                                             */

typedef struct econn {
    struct econn *prev, *next;  /* every open connection, so stop can free them all */
    int fd;
    int writing;                /* 1: pending bytes, interest EPOLLOUT only; 0: EPOLLIN */
    size_t off, len;            /* pending bytes are buf[off, len) */
    char buf[EPOLL_BUF_SIZE];
} econn;

typedef struct eserver {
    int ep;
    int tcp;
    econn *conns;
    pcb_echo_stats st;
} eserver;

/* Distinct tags for the two fds that are not connections. */
static char listen_tag, stop_tag;

static void econn_close(eserver *s, econn *c)
{
    close(c->fd);  /* also removes it from the epoll set */
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static void econn_fail(eserver *s, econn *c, int e)
{
    if (!error_is_quiet(e))
        s->st.errors++;
    econn_close(s, c);
}

/* Sets c's interest to EPOLLOUT (writing) or EPOLLIN.  Returns 0, or -1 with errno set. */
static int econn_want(eserver *s, econn *c, int writing)
{
    struct epoll_event ev = {.events = writing ? EPOLLOUT : EPOLLIN, .data.ptr = c};
    if (epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        return -1;
    c->writing = writing;
    return 0;
}

/* Writes buf[off, len).  Returns 1 when all is written, 0 when some is still pending (the
 * socket is full), -1 with errno set on error. */
static int econn_flush(eserver *s, econn *c)
{
    while (c->off < c->len) {
        ssize_t n = send(c->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (n > 0) {
            c->off += (size_t)n;
            s->st.bytes += (uint64_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            if (n == 0)
                errno = EIO;
            return -1;
        }
    }
    c->off = c->len = 0;
    return 1;
}

/* Flushes and moves interest between EPOLLIN and EPOLLOUT as needed.  May close c. */
static void econn_write(eserver *s, econn *c)
{
    int r = econn_flush(s, c);
    if (r < 0) {
        econn_fail(s, c, errno);
        return;
    }
    if (r == 0 && !c->writing) {
        if (econn_want(s, c, 1) < 0)
            econn_fail(s, c, errno);
    } else if (r == 1 && c->writing) {
        if (econn_want(s, c, 0) < 0)
            econn_fail(s, c, errno);
    }
}

/* One read, then echo it back.  May close c. */
static void econn_read(eserver *s, econn *c)
{
    ssize_t n;
    do
        n = recv(c->fd, c->buf, sizeof(c->buf), 0);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        c->off = 0;
        c->len = (size_t)n;
        econn_write(s, c);
    } else if (n == 0) {
        econn_close(s, c);  /* EOF */
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        econn_fail(s, c, errno);
    }
}

/* Accepts until EAGAIN.  Returns 0, or -1 when accepting must pause (fd or memory
 * exhaustion, or an unexpected error), counted in errors. */
static int eserver_accept(eserver *s, int listen_fd)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            if (errno == EINTR || accept_error_is_transient(errno))
                continue;
            s->st.errors++;  /* EMFILE, ENFILE, ENOBUFS, ENOMEM, or worse */
            return -1;
        }
        s->st.accepted++;
        if (s->tcp)
            set_nodelay(fd);
        econn *c = malloc(sizeof(*c));
        if (c == NULL) {
            close(fd);
            s->st.errors++;
            return -1;
        }
        c->fd = fd;
        c->writing = 0;
        c->off = c->len = 0;
        c->prev = NULL;
        c->next = s->conns;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            free(c);
            s->st.errors++;
            return -1;
        }
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
    }
}

/* Sets listen_fd's interest to EPOLLIN (on) or nothing (off).  Returns 0, or -1. */
static int eserver_listen_interest(eserver *s, int listen_fd, int on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0, .data.ptr = &listen_tag};
    return epoll_ctl(s->ep, EPOLL_CTL_MOD, listen_fd, &ev);
}

int pcb_echo_epoll(int listen_fd, int stop_fd, pcb_echo_stats *stats, char *err, size_t errlen)
{
    eserver s = {.ep = -1};
    struct epoll_event evs[EPOLL_MAX_EVENTS];
    int64_t resume_at = -1;  /* accepting paused until then (monotonic ms), or -1 */
    int rc = -1, saved_errno = 0;

    if (stats)
        memset(stats, 0, sizeof(*stats));
    int lflags = set_nonblocking(listen_fd);
    if (lflags < 0) {
        set_err(err, errlen, "fcntl(listen, O_NONBLOCK)", errno);
        return -1;
    }
    s.tcp = is_inet_socket(listen_fd);
    s.ep = epoll_create1(EPOLL_CLOEXEC);
    if (s.ep < 0) {
        saved_errno = errno;
        set_err(err, errlen, "epoll_create1", errno);
        goto out;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
    if (epoll_ctl(s.ep, EPOLL_CTL_ADD, listen_fd, &ev) < 0) {
        saved_errno = errno;
        set_err(err, errlen, "epoll_ctl(listen)", errno);
        goto out;
    }
    ev.data.ptr = &stop_tag;
    if (epoll_ctl(s.ep, EPOLL_CTL_ADD, stop_fd, &ev) < 0) {
        saved_errno = errno;
        set_err(err, errlen, "epoll_ctl(stop)", errno);
        goto out;
    }

    for (;;) {
        int timeout = -1;
        if (resume_at >= 0) {
            int64_t left = resume_at - now_ms();
            if (left <= 0) {
                if (eserver_listen_interest(&s, listen_fd, 1) == 0)
                    resume_at = -1;
                else {
                    s.st.errors++;
                    resume_at = now_ms() + ACCEPT_PAUSE_MS;
                }
                continue;
            }
            timeout = (int)left;
        }
        int n = epoll_wait(s.ep, evs, EPOLL_MAX_EVENTS, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            /* Cannot happen with a valid epoll fd; stop rather than spin. */
            saved_errno = errno;
            set_err(err, errlen, "epoll_wait", errno);
            goto out;
        }
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            uint32_t e = evs[i].events;
            if (tag == &stop_tag) {
                rc = 0;
                goto out;
            }
            if (tag == &listen_tag) {
                if (resume_at < 0 && eserver_accept(&s, listen_fd) < 0) {
                    /* Level-triggered: a pending connection would wake us at once, so
                     * drop listen interest and let the epoll_wait timeout bring it back. */
                    if (eserver_listen_interest(&s, listen_fd, 0) < 0)
                        s.st.errors++;
                    resume_at = now_ms() + ACCEPT_PAUSE_MS;
                }
                continue;
            }
            econn *c = tag;
            if (e & (EPOLLERR | EPOLLHUP))
                e |= EPOLLIN | EPOLLOUT;  /* the read or write below reports the real error */
            /* Only one of the two applies: interest is EPOLLIN xor EPOLLOUT.  Each may close
             * c; each fd appears once per epoll_wait, so no later event refers to it. */
            if (c->writing) {
                if (e & EPOLLOUT)
                    econn_write(&s, c);
            } else if (e & EPOLLIN) {
                econn_read(&s, c);
            }
        }
    }

out:
    while (s.conns)
        econn_close(&s, s.conns);
    if (s.ep >= 0)
        close(s.ep);
    restore_flags(listen_fd, lflags);
    if (stats)
        *stats = s.st;
    if (rc < 0)
        errno = saved_errno;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* pcb_echo_threads                                                                           */

/* Counters shared by the accepting thread and its workers.  pcb_echo_threads returns while
 * workers may still run (and count), so the block lives on the heap with a reference count:
 * one reference for the accepting call, one per live worker; the last one out frees it.  The
 * caller's *stats gets a snapshot of the counters taken at return (atomic loads), so it is
 * never written after pcb_echo_threads has returned. */
typedef struct tshared {
    uint64_t accepted, bytes, errors;
    long refs;
} tshared;

typedef struct tconn {
    int fd;
    tshared *sh;
} tconn;

static void tshared_unref(tshared *sh)
{
    if (__atomic_sub_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(sh);
}

static void tcount(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/* Echoes one connection until EOF or an error, then closes it. */
static void *tworker(void *arg)
{
    tconn tc = *(tconn *)arg;
    char buf[THREAD_BUF_SIZE];
    int e = 0;

    free(arg);
    for (;;) {
        ssize_t n = recv(tc.fd, buf, sizeof(buf), 0);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            e = errno;
            break;
        }
        /* Counted before sending, so the count is visible before the client can see the
         * echo (the caller snapshots the counters the moment it stops); what a failed send
         * leaves unsent is taken back below. */
        tcount(&tc.sh->bytes, (uint64_t)n);
        size_t off = 0;
        while (off < (size_t)n) {
            ssize_t w = send(tc.fd, buf + off, (size_t)n - off, MSG_NOSIGNAL);
            if (w > 0) {
                off += (size_t)w;
            } else if (w < 0 && errno == EINTR) {
                continue;
            } else {
                e = w < 0 ? errno : EIO;
                break;
            }
        }
        if (e) {
            __atomic_sub_fetch(&tc.sh->bytes, (uint64_t)n - off, __ATOMIC_RELAXED);
            break;
        }
    }
    if (e && !error_is_quiet(e))
        tcount(&tc.sh->errors, 1);
    close(tc.fd);
    tshared_unref(tc.sh);
    return NULL;
}

/* Starts a detached worker for fd.  Returns 0, or -1 with errno set (fd then still open). */
static int tspawn(int fd, tshared *sh, const pthread_attr_t *attr)
{
    tconn *tc = malloc(sizeof(*tc));
    if (tc == NULL)
        return -1;
    tc->fd = fd;
    tc->sh = sh;
    __atomic_add_fetch(&sh->refs, 1, __ATOMIC_RELAXED);

    /* The worker inherits a fully blocked mask, with no window where a signal meant for
     * the caller (Python's handlers) could land in it. */
    sigset_t all, old;
    pthread_t t;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&t, attr, tworker, tc);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        __atomic_sub_fetch(&sh->refs, 1, __ATOMIC_RELAXED);  /* the caller holds one */
        free(tc);
        errno = r;
        return -1;
    }
    return 0;
}

/* Accepts until EAGAIN, one worker each.  Returns 0, or -1 when accepting must pause. */
static int taccept(int listen_fd, int tcp, tshared *sh, const pthread_attr_t *attr)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);  /* blocking socket */
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            if (errno == EINTR || accept_error_is_transient(errno))
                continue;
            tcount(&sh->errors, 1);
            return -1;
        }
        tcount(&sh->accepted, 1);
        if (tcp)
            set_nodelay(fd);
        if (tspawn(fd, sh, attr) < 0) {
            close(fd);
            tcount(&sh->errors, 1);
            /* Out of threads or memory: pause accepting too, rather than spin on it. */
            return -1;
        }
    }
}

/* The worker's stack size: want (0: 64 KiB), raised to at least what a thread needs plus its
 * on-stack buffer, rounded up to whole pages. */
static size_t thread_stack_size(size_t want)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t min = (size_t)PTHREAD_STACK_MIN + THREAD_BUF_SIZE;  /* a sysconf call on glibc >= 2.34 */
    size_t sz = want ? want : THREAD_STACK_DEFAULT;
    if (page <= 0)
        page = 4096;
    if (sz < min)
        sz = min;
    return (sz + (size_t)page - 1) / (size_t)page * (size_t)page;
}

int pcb_echo_threads(int listen_fd, int stop_fd, size_t stack_size, pcb_echo_stats *stats,
                     char *err, size_t errlen)
{
    pthread_attr_t attr;
    int rc = -1, saved_errno = 0, r;
    int64_t resume_at = -1;

    if (stats)
        memset(stats, 0, sizeof(*stats));
    tshared *sh = calloc(1, sizeof(*sh));
    if (sh == NULL) {
        set_err(err, errlen, "malloc", errno);
        return -1;
    }
    sh->refs = 1;
    if ((r = pthread_attr_init(&attr)) != 0) {
        free(sh);
        set_err(err, errlen, "pthread_attr_init", r);
        errno = r;
        return -1;
    }
    int lflags = -1;
    if ((r = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED)) != 0) {
        saved_errno = r;
        set_err(err, errlen, "pthread_attr_setdetachstate", r);
        goto out;
    }
    if ((r = pthread_attr_setstacksize(&attr, thread_stack_size(stack_size))) != 0) {
        saved_errno = r;
        set_err(err, errlen, "pthread_attr_setstacksize", r);
        goto out;
    }
    lflags = set_nonblocking(listen_fd);
    if (lflags < 0) {
        saved_errno = errno;
        set_err(err, errlen, "fcntl(listen, O_NONBLOCK)", errno);
        goto out;
    }
    int tcp = is_inet_socket(listen_fd);

    for (;;) {
        struct pollfd pfd[2] = {
            {.fd = stop_fd, .events = POLLIN},
            {.fd = listen_fd, .events = POLLIN},
        };
        int timeout = POLL_TIMEOUT_MS;
        if (resume_at >= 0) {
            int64_t left = resume_at - now_ms();
            if (left <= 0) {
                resume_at = -1;
            } else {
                pfd[1].fd = -1;  /* ignored by poll: accepting paused */
                timeout = (int)left;
            }
        }
        int n = poll(pfd, 2, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            saved_errno = errno;
            set_err(err, errlen, "poll", errno);
            goto out;
        }
        if (pfd[0].revents & POLLNVAL) {
            saved_errno = EBADF;
            set_err(err, errlen, "poll(stop)", EBADF);
            goto out;
        }
        if (pfd[1].revents & POLLNVAL) {
            saved_errno = EBADF;
            set_err(err, errlen, "poll(listen)", EBADF);
            goto out;
        }
        if (pfd[0].revents) {
            rc = 0;
            goto out;
        }
        if (pfd[1].revents && taccept(listen_fd, tcp, sh, &attr) < 0)
            resume_at = now_ms() + ACCEPT_PAUSE_MS;
    }

out:
    pthread_attr_destroy(&attr);
    if (lflags >= 0)
        restore_flags(listen_fd, lflags);
    if (stats) {
        stats->accepted = __atomic_load_n(&sh->accepted, __ATOMIC_RELAXED);
        stats->bytes = __atomic_load_n(&sh->bytes, __ATOMIC_RELAXED);
        stats->errors = __atomic_load_n(&sh->errors, __ATOMIC_RELAXED);
    }
    tshared_unref(sh);
    if (rc < 0)
        errno = saved_errno;
    return rc;
}
