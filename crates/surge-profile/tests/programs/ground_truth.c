/*
 * A program with known I/O, for the shim's ground-truth tests (tests/ground_truth.rs).
 *
 *   ground_truth io DIR N     the calls listed below, N data files
 *   ground_truth crash DIR    opens and writes 5 files, then dies of SIGSEGV
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
    if (argc >= 3 && strcmp(argv[1], "crash") == 0) {
        dir = argv[2];
        return crash();
    }
    fprintf(stderr, "usage: ground_truth io DIR N | ground_truth crash DIR\n");
    return 2;
}
