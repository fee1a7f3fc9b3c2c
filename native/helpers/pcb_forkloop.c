/* pcb_forkloop: the study's s_fork as a program of its own.
 *
 * fork() copies the calling process's page tables and mappings, so its cost grows with the
 * caller's memory: timed inside the pytest process it measures pytest as much as fork.  The
 * study timed fork from a small C program; this is one, built beside the extension by setup.py
 * (plain libc, no Python, no sanitizers) and run by pyconcbench.micro once per round.
 *
 *   pcb_forkloop N      N forks of a child that _exit(0)s at once, each waited for
 *
 * After a short untimed warm-up it times an empty loop of N iterations, then the N fork +
 * waitpid pairs, both with CLOCK_MONOTONIC, and prints one JSON line on stdout:
 *   {"case": "fork_waitpid", "ops": N, "elapsed_ns": ..., "empty_ns": ..., "check": <children
 *    that exited 0>, "waited_ns": <runnable but off the CPU, or -1>, "rss_kib": ...,
 *    "vm_kib": ..., "pte_kib": ..., "maps": <mappings>}
 * where the memory figures are this process's, read just before the timed loop.  Exit
 * status 0; 2 for a bad argument and 1 for a failed fork or wait, with one line on stderr.
 * The caller pins it, bounds its run time, and has the kernel kill it if the caller dies
 * (PR_SET_PDEATHSIG, set before exec).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_N 100000000ULL

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Nanoseconds this thread has been runnable but waiting for its CPU, or -1. */
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

/* A field of /proc/self/status in KiB ("VmRSS"), or -1. */
static long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return -1;
    char line[256];
    size_t len = strlen(key);
    long v = -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, len) == 0 && line[len] == ':') {
            v = strtol(line + len + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static long mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return -1;
    long n = 0;
    int c;
    while ((c = getc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* One fork + waitpid: 1 when the child exited 0, 0 when it did not, -1 on failure. */
static int fork_one(void)
{
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pcb_forkloop: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0)
        _exit(0);
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "pcb_forkloop: waitpid: %s\n", strerror(errno));
            return -1;
        }
    }
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv)
{
    char *end = NULL;
    unsigned long long n = argc == 2 ? strtoull(argv[1], &end, 10) : 0;
    if (argc != 2 || !end || *end || argv[1][0] == '-' || n < 1 || n > MAX_N) {
        fprintf(stderr, "usage: pcb_forkloop N (1 <= N <= %llu)\n", MAX_N);
        return 2;
    }
    uint64_t warm = n / 100 + 1; /* as the in-process case: warm_count(n) / 10 + 1 */
    if (warm > 1000)
        warm = 1000;
    for (uint64_t i = 0; i < warm; i++) {
        if (fork_one() < 0)
            return 1;
    }
    long rss = status_kib("VmRSS"), vm = status_kib("VmSize"), pte = status_kib("VmPTE");
    long maps = mappings();

    uint64_t acc = 0;
    int64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        acc++;
        __asm__ volatile("" : "+r"(acc) : : "memory");
    }
    int64_t empty = now_ns() - t0;

    uint64_t ok = 0;
    int64_t w0 = run_delay_ns();
    t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        int v = fork_one();
        if (v < 0)
            return 1;
        ok += (uint64_t)v;
    }
    int64_t elapsed = now_ns() - t0;
    int64_t w1 = run_delay_ns();
    int64_t waited = w0 >= 0 && w1 >= w0 ? w1 - w0 : -1;

    printf("{\"case\": \"fork_waitpid\", \"ops\": %llu, \"elapsed_ns\": %lld, \"empty_ns\": %lld, "
           "\"check\": %llu, \"waited_ns\": %lld, \"rss_kib\": %ld, \"vm_kib\": %ld, "
           "\"pte_kib\": %ld, \"maps\": %ld}\n",
           n, (long long)elapsed, (long long)empty, (unsigned long long)ok, (long long)waited,
           rss, vm, pte, maps);
    return fflush(stdout) == 0 ? 0 : 1;
}
