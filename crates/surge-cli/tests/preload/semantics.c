/* What a program sees of a file on a Surge mount, with or without libsurge_preload.so: the
 * test runs it both ways and compares. Prints "ok" and exits 0 when every check holds. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "FAIL line %d: %s (errno %d)\n", __LINE__, #c, errno); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *p = argv[1];
    static char buf[65536], rd[65536];
    struct stat st;
    for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (char)(i * 7 + 3);

    int fd = open(p, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, buf, 10000) == 10000);
    CHECK(lseek(fd, 0, SEEK_CUR) == 10000);
    CHECK(fstat(fd, &st) == 0 && st.st_size == 10000);
    CHECK(lseek(fd, 0, SEEK_END) == 10000);
    CHECK(pread(fd, rd, 100, 50) == 100 && memcmp(rd, buf + 50, 100) == 0);

    /* A write past the end leaves a hole of zeros. */
    CHECK(pwrite(fd, buf, 1000, 20000) == 1000);
    CHECK(fstat(fd, &st) == 0 && st.st_size == 21000);
    CHECK(pread(fd, rd, 100, 15000) == 100);
    for (int i = 0; i < 100; i++) CHECK(rd[i] == 0);

    /* A stat by name sees the size before any fsync, and after it. */
    CHECK(stat(p, &st) == 0 && st.st_size == 21000);
    CHECK(lstat(p, &st) == 0 && st.st_size == 21000);
    CHECK(fstatat(AT_FDCWD, p, &st, 0) == 0 && st.st_size == 21000);
    CHECK(fsync(fd) == 0);
    CHECK(stat(p, &st) == 0 && st.st_size == 21000);

    /* A dup shares the offset. */
    CHECK(lseek(fd, 5000, SEEK_SET) == 5000);
    int d = dup(fd);
    CHECK(d >= 0);
    CHECK(write(d, "dupdup", 6) == 6);
    CHECK(lseek(fd, 0, SEEK_CUR) == 5006);
    CHECK(write(fd, "XY", 2) == 2);
    CHECK(close(d) == 0);
    struct iovec iov[2] = {{"abc", 3}, {"defg", 4}};
    CHECK(writev(fd, iov, 2) == 7);
    CHECK(pread(fd, rd, 15, 5000) == 15 && memcmp(rd, "dupdupXYabcdefg", 15) == 0);
    CHECK(lseek(fd, 5000, SEEK_SET) == 5000);
    struct iovec riov[2] = {{rd, 5}, {rd + 5, 10}};
    CHECK(readv(fd, riov, 2) == 15 && memcmp(rd, "dupdupXYabcdefg", 15) == 0);

    /* A memory map sees what was written. */
    char *m = mmap(NULL, 21000, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    CHECK(memcmp(m + 5000, "dupdupXYabcdefg", 15) == 0 && memcmp(m + 20000, buf, 1000) == 0);
    CHECK(munmap(m, 21000) == 0);

    /* A child writes through the shared descriptor at the shared offset. */
    CHECK(lseek(fd, 0, SEEK_END) == 21000);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) _exit(write(fd, "child", 5) == 5 ? 0 : 1);
    int status;
    CHECK(waitpid(c, &status, 0) == c && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(lseek(fd, 0, SEEK_CUR) == 21005);
    CHECK(write(fd, "parent", 6) == 6);
    CHECK(ftruncate(fd, 21008) == 0);
    CHECK(fstat(fd, &st) == 0 && st.st_size == 21008);
    CHECK(close(fd) == 0);

    /* Read-only: writes fail, reads see everything. */
    fd = open(p, O_RDONLY);
    CHECK(fd >= 0);
    CHECK(write(fd, "x", 1) == -1 && errno == EBADF);
    CHECK(read(fd, rd, sizeof rd) == 21008);
    CHECK(memcmp(rd + 21000, "childpar", 8) == 0 && memcmp(rd, buf, 5000) == 0);
    CHECK(close(fd) == 0);

    /* A stream over a descriptor, closed with fclose; the number is then reused by a pipe,
     * which must not be taken for the file. */
    fd = open(p, O_RDWR);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "r+");
    CHECK(f != NULL);
    CHECK(fputs("stdio", f) >= 0);
    CHECK(fclose(f) == 0);
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    CHECK(write(pfd[1], "pipe", 4) == 4);
    CHECK(read(pfd[0], rd, 4) == 4 && memcmp(rd, "pipe", 4) == 0);
    close(pfd[0]);
    close(pfd[1]);

    /* Appends stay with the mount and land at the end the last close committed. */
    fd = open(p, O_WRONLY | O_APPEND);
    CHECK(fd >= 0);
    CHECK(write(fd, "tail", 4) == 4);
    CHECK(close(fd) == 0);
    CHECK(stat(p, &st) == 0 && st.st_size == 21012);
    printf("ok\n");
    return 0;
}
