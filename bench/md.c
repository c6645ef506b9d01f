/* mdtest-style metadata rates for bench/dataplane.sh: each of P processes creates N empty files
 * in its own directory, stats them, then unlinks them; phases are separated by a barrier (a pipe)
 * and timed from the first start to the last finish. Prints one line per phase:
 *   create <ops/s>
 *   stat <ops/s>
 *   unlink <ops/s>
 * Kept in C so the harness costs nothing next to what it measures. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static double now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR FILES_PER_PROC PROCS\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int n = atoi(argv[2]), procs = atoi(argv[3]);
    const char *phases[] = {"create", "stat", "unlink"};
    int go[3][2], done[2];
    for (int i = 0; i < 3; i++)
        if (pipe(go[i])) return 1;
    if (pipe(done)) return 1;
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            char d[4096], f[4200];
            snprintf(d, sizeof d, "%s/md.%d", dir, p);
            mkdir(d, 0755);
            for (int ph = 0; ph < 3; ph++) {
                char c;
                if (read(go[ph][0], &c, 1) != 1) _exit(1);
                for (int i = 0; i < n; i++) {
                    snprintf(f, sizeof f, "%s/f.%d", d, i);
                    if (ph == 0) {
                        int fd = open(f, O_CREAT | O_WRONLY | O_EXCL, 0644);
                        if (fd < 0) { perror(f); _exit(1); }
                        close(fd);
                    } else if (ph == 1) {
                        struct stat st;
                        if (stat(f, &st)) { perror(f); _exit(1); }
                    } else if (unlink(f)) { perror(f); _exit(1); }
                }
                if (write(done[1], "x", 1) != 1) _exit(1);
            }
            rmdir(d);
            _exit(0);
        }
    }
    for (int ph = 0; ph < 3; ph++) {
        double t0 = now();
        for (int p = 0; p < procs; p++)
            if (write(go[ph][1], "x", 1) != 1) return 1;
        for (int p = 0; p < procs; p++) {
            char c;
            if (read(done[0], &c, 1) != 1) return 1;
        }
        printf("%s %.0f\n", phases[ph], (double)n * procs / (now() - t0));
    }
    int status, rc = 0;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status)) rc = 1;
    return rc;
}
