/*
 * A program with known I/O, for the shim's ground-truth tests (tests/ground_truth.rs).
 *
 *   ground_truth io DIR N     the calls listed below, N data files
 *   ground_truth crash DIR    opens and writes 5 files, then dies of SIGSEGV
 *   ground_truth threads DIR  8 threads at once: each opens DIR/own<k> and writes it 500 times
 *                             (100 B), writes 200 x 10 B to the shared DIR/shared fd, and
 *                             stats DIR/shared 300 times
 *
 * "io" makes exactly (expected counts are spelled out in the test):
 *   main thread, for each i < N: DIR/f<i>: open(O_CREAT), 3 x write(4096), fsync, close,
 *        stat, lstat, fstatat, statx, access
 *   a second thread: DIR/t: open, 10 x pwrite(1000), 5 x pread(1000), 3 x lseek, fdatasync, close
 *   a forked child: DIR/c: open, 7 x write(100), close; DIR/s: fopen, 1000 x fwrite(10), fclose
 *   then: rename f0 -> g0, unlink f1, mkdir d, rmdir d, stat of DIR/missing (fails),
 *        opendir DIR, readdir to the end, closedir
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dir;

static void path(char *buf, const char *name) { snprintf(buf, 4096, "%s/%s", dir, name); }

static void *thread_io(void *arg) {
    (void)arg;
    char p[4096], buf[1000];
    memset(buf, 't', sizeof buf);
    path(p, "t");
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
    for (int i = 0; i < 10; i++)
        if (pwrite(fd, buf, sizeof buf, (off_t)i * 1000) != (ssize_t)sizeof buf)
            exit(3);
    for (int i = 0; i < 5; i++)
        if (pread(fd, buf, sizeof buf, (off_t)i * 2000) != (ssize_t)sizeof buf)
            exit(3);
    lseek(fd, 0, SEEK_SET);
    lseek(fd, 10, SEEK_CUR);
    lseek(fd, 0, SEEK_END);
    fdatasync(fd);
    close(fd);
    return NULL;
}

static int io(int n) {
    char p[4096], q[4096], buf[4096];
    memset(buf, 'x', sizeof buf);
    pthread_t th;
    if (pthread_create(&th, NULL, thread_io, NULL) != 0)
        return 2;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "f%d", i);
        path(p, name);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            return 2;
        for (int k = 0; k < 3; k++)
            if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
                return 2;
        fsync(fd);
        close(fd);
        struct stat st;
        struct statx stx;
        stat(p, &st);
        lstat(p, &st);
        fstatat(AT_FDCWD, p, &st, 0);
        statx(AT_FDCWD, p, 0, STATX_SIZE, &stx);
        access(p, R_OK);
    }
    pthread_join(th, NULL);
    pid_t child = fork();
    if (child == 0) {
        path(p, "c");
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        for (int i = 0; i < 7; i++)
            if (write(fd, buf, 100) != 100)
                _exit(4);
        close(fd);
        path(p, "s");
        FILE *f = fopen(p, "w");
        if (!f)
            _exit(4);
        for (int i = 0; i < 1000; i++)
            fwrite(buf, 1, 10, f);
        fclose(f);
        exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (n > 1) {
        path(p, "f0");
        path(q, "g0");
        rename(p, q);
        path(p, "f1");
        unlink(p);
    }
    path(p, "d");
    mkdir(p, 0755);
    rmdir(p);
    struct stat st;
    path(p, "missing");
    stat(p, &st);
    DIR *d = opendir(dir);
    if (!d)
        return 2;
    while (readdir(d))
        ;
    closedir(d);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 5;
}

static int shared_fd;
static pthread_barrier_t all_started;

static void *hammer(void *arg) {
    /* All 8 threads are alive at once before any does I/O: the peak thread count is exact. */
    pthread_barrier_wait(&all_started);
    char p[4096], name[32], buf[100];
    memset(buf, 'h', sizeof buf);
    snprintf(name, sizeof name, "own%ld", (long)arg);
    path(p, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (int i = 0; i < 500; i++)
        if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
            exit(3);
    close(fd);
    path(p, "shared");
    struct stat st;
    for (int i = 0; i < 200; i++)
        if (write(shared_fd, buf, 10) != 10)
            exit(3);
    for (int i = 0; i < 300; i++)
        stat(p, &st);
    return NULL;
}

static int threads(void) {
    char p[4096];
    path(p, "shared");
    shared_fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    pthread_t th[8];
    pthread_barrier_init(&all_started, NULL, 8);
    for (long k = 0; k < 8; k++)
        if (pthread_create(&th[k], NULL, hammer, (void *)k) != 0)
            return 2;
    for (int k = 0; k < 8; k++)
        pthread_join(th[k], NULL);
    close(shared_fd);
    return 0;
}

static int crash(void) {
    char p[4096], name[32];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "k%d", i);
        path(p, name);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (write(fd, "12345678", 8) != 8)
            return 2;
        /* No close: the process dies with these files open. */
    }
    raise(SIGSEGV);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "io") == 0) {
        dir = argv[2];
        return io(atoi(argv[3]));
    }
    if (argc >= 3 && strcmp(argv[1], "threads") == 0) {
        dir = argv[2];
        return threads();
    }
    if (argc >= 3 && strcmp(argv[1], "crash") == 0) {
        dir = argv[2];
        return crash();
    }
    fprintf(stderr, "usage: ground_truth io DIR N | crash DIR | threads DIR\n");
    return 2;
}
