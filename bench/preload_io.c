/* The workloads of bench/preload.sh, timed in the process that does them (so the harness costs
 * nothing next to what it measures). One line on stdout: the rate.
 *   preload_io seq FILE MIB         8 MiB writes of MIB MiB, one fsync at the end -> MiB/s
 *   preload_io fsync FILE N         N 4 KiB writes, each followed by fsync         -> ops/s
 *   preload_io small DIR N          N files: create, write 4 KiB, close            -> files/s */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static double now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec / 1e6;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s seq|fsync|small PATH COUNT\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *path = argv[2];
    long n = atol(argv[3]);
    static char buf[8 << 20];
    memset(buf, 0x5a, sizeof buf);
    double t0 = now(), rate = 0;
    if (strcmp(mode, "seq") == 0) {
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (fd < 0) die("open");
        for (long i = 0; i < n / 8; i++)
            if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) die("write");
        if (fsync(fd) != 0) die("fsync");
        if (close(fd) != 0) die("close");
        rate = n / (now() - t0);
    } else if (strcmp(mode, "fsync") == 0) {
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (fd < 0) die("open");
        for (long i = 0; i < n; i++) {
            if (write(fd, buf, 4096) != 4096) die("write");
            if (fsync(fd) != 0) die("fsync");
        }
        if (close(fd) != 0) die("close");
        rate = n / (now() - t0);
    } else if (strcmp(mode, "small") == 0) {
        char name[4096];
        for (long i = 0; i < n; i++) {
            snprintf(name, sizeof name, "%s/f%ld", path, i);
            int fd = open(name, O_CREAT | O_TRUNC | O_WRONLY, 0644);
            if (fd < 0) die("open");
            if (write(fd, buf, 4096) != 4096) die("write");
            if (close(fd) != 0) die("close");
        }
        rate = n / (now() - t0);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    printf("%.1f\n", rate);
    return 0;
}
