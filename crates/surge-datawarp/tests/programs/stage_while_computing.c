/*
 * A program written for Cray DataWarp's libdatawarp, as codes on Cori and Shaheen were: it
 * stages its inputs in while it computes, stages results out now and at job end, and checks
 * every answer of the API. Built by the libdatawarp tests with the system C compiler against
 * Surge's datawarp.h and libdatawarp.so, and run inside a `surge run` job.
 *
 * Usage: stage_while_computing PFS_DIR   (the job's inputs are PFS_DIR/in.dat, PFS_DIR/tree,
 * PFS_DIR/a.txt, PFS_DIR/b.txt; it writes PFS_DIR/report.txt and stages to PFS_DIR/out).
 */
#include <datawarp.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *pfs, *dw;
static FILE *report;
static int failures;

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "stage_while_computing:%d: %s failed: ", __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, " (last error: %s)\n", surge_dw_last_error());            \
            failures++;                                                               \
        }                                                                             \
    } while (0)

static char *at(const char *root, const char *rel) {
    char *p = malloc(strlen(root) + strlen(rel) + 2);
    sprintf(p, "%s/%s", root, rel);
    return p;
}

/* Reads a whole file; its size in *n. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? len : 1);
    *n = fread(b, 1, len, f);
    fclose(f);
    return b;
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); failures++; return; }
    fputs(text, f);
    fclose(f);
}

int main(int argc, char **argv) {
    int rc, complete, pending, deferred, failed;
    if (argc != 2) { fprintf(stderr, "usage: %s PFS_DIR\n", argv[0]); return 2; }
    pfs = argv[1];
    dw = getenv("DW_JOB_STRIPED");
    if (!dw) { fprintf(stderr, "DW_JOB_STRIPED is not set\n"); return 2; }
    report = fopen(at(pfs, "report.txt"), "w");

    /* Stage in a large file, a directory and a list, then compute while they copy. */
    rc = dw_stage_file_in(at(dw, "in.dat"), at(pfs, "in.dat"));
    CHECK(rc == 0, "dw_stage_file_in returned %d", rc);
    mkdir(at(dw, "tree"), 0755);
    rc = dw_stage_directory_in(at(dw, "tree"), at(pfs, "tree"));
    CHECK(rc == 0, "dw_stage_directory_in returned %d", rc);
    const char *list[] = {at(pfs, "a.txt"), at(pfs, "b.txt"), NULL};
    mkdir(at(dw, "list"), 0755);
    rc = dw_stage_list_in(at(dw, "list"), list);
    CHECK(rc == 0, "dw_stage_list_in returned %d", rc);

    /* One stage per file at a time. */
    int again = dw_stage_file_in(at(dw, "in.dat"), at(pfs, "in.dat"));
    CHECK(again == 0 || again == -EBUSY, "a second stage of in.dat returned %d", again);

    double x = 0;
    long polls = 0, pending_seen = 0;
    for (;;) {
        for (int i = 0; i < 200000; i++) x += (double)i * 1e-9; /* the computation */
        rc = dw_query_file_stage(at(dw, "in.dat"), &complete, &pending, &deferred, &failed);
        CHECK(rc == 0, "dw_query_file_stage returned %d", rc);
        if (rc != 0) break;
        polls++;
        pending_seen += pending;
        CHECK(complete + pending + deferred + failed == 1, "one stage, counted once: %d %d %d %d",
              complete, pending, deferred, failed);
        if (complete || failed) break;
    }
    fprintf(report, "polls %ld pending_seen %ld compute %g\n", polls, pending_seen, x);

    CHECK((rc = dw_wait_file_stage(at(dw, "in.dat"))) == 0, "dw_wait_file_stage returned %d", rc);
    CHECK((rc = dw_wait_directory_stage(at(dw, "tree"))) == 0, "dw_wait_directory_stage: %d", rc);
    CHECK((rc = dw_wait_list_stage((const char **)(const char *[]){at(dw, "list/a.txt"),
                                                                  at(dw, "list/b.txt"), NULL})) == 0,
          "dw_wait_list_stage returned %d", rc);
    CHECK(same_file(at(dw, "in.dat"), at(pfs, "in.dat")), "in.dat arrived byte for byte");
    CHECK(same_file(at(dw, "tree/sub/deep.txt"), at(pfs, "tree/sub/deep.txt")), "the tree arrived");
    CHECK(same_file(at(dw, "list/b.txt"), at(pfs, "b.txt")), "the list arrived");
    rc = dw_query_directory_stage(dw, &complete, &pending, &deferred, &failed);
    CHECK(rc == 0 && complete == 3 + (again == 0) && pending == 0 && failed == 0,
          "directory query: rc %d complete %d pending %d failed %d", rc, complete, pending, failed);
    rc = dw_query_list_stage((const char **)(const char *[]){at(dw, "list/a.txt"), NULL},
                             &complete, NULL, NULL, NULL);
    CHECK(rc == 0 && complete == 1, "list query: rc %d complete %d", rc, complete);

    /* Layout of an open file: DataWarp's default 8 MiB stripes, over one fragment or more (a
       file staged in for a job whose mount reads it with passthrough is one stripe); the index
       is the fragment of the first stripe among the instance's. */
    int fd = open(at(dw, "in.dat"), O_RDONLY);
    int size = 0, width = 0, index = -1;
    rc = dw_get_stripe_configuration(fd, &size, &width, &index);
    CHECK(rc == 0 && size == 8 << 20 && width >= 1 && index >= 0,
          "dw_get_stripe_configuration: rc %d size %d width %d index %d", rc, size, width, index);
    fprintf(report, "stripe %d %d %d\n", size, width, index);
    CHECK(dw_set_stripe_configuration(fd, size, width) == 0, "keeping the layout is allowed");
    CHECK(dw_set_stripe_configuration(fd, size * 2, width) == -EBUSY,
          "a new layout of a file with data is not");
    close(fd);
    /* An empty file takes a new layout, and reads it back. */
    fd = open(at(dw, "striped-1m.dat"), O_RDWR | O_CREAT, 0644);
    rc = dw_set_stripe_configuration(fd, 1 << 20, 1);
    CHECK(rc == 0, "dw_set_stripe_configuration of an empty file: %d", rc);
    rc = dw_get_stripe_configuration(fd, &size, &width, &index);
    CHECK(rc == 0 && size == 1 << 20 && width == 1 && index >= 0,
          "after setting: rc %d size %d width %d index %d", rc, size, width, index);
    CHECK(write(fd, "x", 1) == 1, "write after setting the layout");
    close(fd);
    char *mds = dw_get_mds_path(dw, 42);
    CHECK(mds && strcmp(mds, dw) == 0, "dw_get_mds_path gave %s", mds ? mds : "NULL");
    free(mds);
    CHECK(dw_get_mds_path("/tmp", 1) == NULL, "dw_get_mds_path of a non-mount");
    CHECK(dw_set_stage_concurrency(dw, 4) == 0, "dw_set_stage_concurrency");
    CHECK(dw_set_stage_concurrency(dw, 0) == -EINVAL, "a concurrency of 0");

    /* Results: one staged out now, one at job end (written after asking), one revoked. */
    mkdir(at(dw, "out"), 0755);
    char sum[64];
    size_t n = 0;
    unsigned char *data = slurp(at(dw, "in.dat"), &n);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s = s * 31 + data[i];
    free(data);
    snprintf(sum, sizeof sum, "%zu %llu\n", n, (unsigned long long)s);
    write_text(at(dw, "out/sum.txt"), sum);
    rc = dw_stage_file_out(at(dw, "out/sum.txt"), at(pfs, "out/sum.txt"), DW_STAGE_IMMEDIATE);
    CHECK(rc == 0, "dw_stage_file_out returned %d", rc);
    CHECK((rc = dw_wait_file_stage(at(dw, "out/sum.txt"))) == 0, "waiting for sum.txt: %d", rc);
    CHECK(same_file(at(dw, "out/sum.txt"), at(pfs, "out/sum.txt")), "sum.txt is on the PFS");

    write_text(at(dw, "final.txt"), "draft\n");
    rc = dw_stage_file_out(at(dw, "final.txt"), at(pfs, "out/final.txt"), DW_STAGE_AT_JOB_END);
    CHECK(rc == 0, "dw_stage_file_out at job end returned %d", rc);
    rc = dw_query_file_stage(at(dw, "final.txt"), &complete, &pending, &deferred, &failed);
    CHECK(rc == 0 && deferred == 1 && complete == 0, "deferred: rc %d deferred %d", rc, deferred);
    CHECK(dw_wait_file_stage(at(dw, "final.txt")) == 0, "waiting for a deferred stage returns");
    write_text(at(dw, "final.txt"), "final answer\n");

    write_text(at(dw, "revoked.txt"), "never staged\n");
    CHECK(dw_stage_file_out(at(dw, "revoked.txt"), at(pfs, "out/revoked.txt"),
                            DW_STAGE_AT_JOB_END) == 0, "deferring revoked.txt");
    CHECK(dw_stage_file_out(at(dw, "revoked.txt"), at(pfs, "out/revoked.txt"),
                            DW_REVOKE_STAGE_AT_JOB_END) == 0, "revoking revoked.txt");
    CHECK(dw_query_file_stage(at(dw, "revoked.txt"), NULL, NULL, NULL, NULL) == -EINVAL,
          "a revoked stage is forgotten");

    write_text(at(dw, "early.txt"), "early\n");
    CHECK(dw_stage_file_out(at(dw, "early.txt"), at(pfs, "out/early.txt"),
                            DW_STAGE_AT_JOB_END) == 0, "deferring early.txt");
    CHECK(dw_stage_file_out(at(dw, "early.txt"), at(pfs, "out/early.txt"),
                            DW_ACTIVATE_DEFERRED_STAGE) == 0, "activating early.txt");
    CHECK(dw_wait_file_stage(at(dw, "early.txt")) == 0, "waiting for early.txt");
    CHECK(same_file(at(dw, "early.txt"), at(pfs, "out/early.txt")), "early.txt is on the PFS");

    mkdir(at(dw, "out/dir"), 0755);
    write_text(at(dw, "out/dir/x.txt"), "x\n");
    CHECK(dw_stage_directory_out(at(dw, "out/dir"), at(pfs, "out/dir"), DW_STAGE_IMMEDIATE) == 0,
          "dw_stage_directory_out");
    const char *outs[] = {at(dw, "list/a.txt"), at(dw, "list/b.txt"), NULL};
    CHECK(dw_stage_list_out(outs, at(pfs, "out/list"), DW_STAGE_IMMEDIATE) == 0,
          "dw_stage_list_out");
    CHECK(dw_wait_directory_stage(at(dw, "out")) == 0, "waiting for out/");
    CHECK(dw_wait_list_stage(outs) == 0, "waiting for the list");
    CHECK(same_file(at(dw, "list/a.txt"), at(pfs, "out/list/a.txt")), "a.txt staged out");

    /* Terminating a stage in flight leaves no half-written file (unless it finished first). */
    rc = dw_stage_file_in(at(dw, "again.dat"), at(pfs, "in.dat"));
    CHECK(rc == 0, "staging again.dat returned %d", rc);
    CHECK((rc = dw_terminate_file_stage(at(dw, "again.dat"))) == 0, "terminate returned %d", rc);
    rc = dw_query_file_stage(at(dw, "again.dat"), &complete, &pending, NULL, NULL);
    if (rc == 0) {
        CHECK(complete == 1 && same_file(at(dw, "again.dat"), at(pfs, "in.dat")),
              "a stage that finished before terminate is whole");
        fprintf(report, "terminate: finished first\n");
    } else {
        CHECK(rc == -ENOENT && access(at(dw, "again.dat"), F_OK) != 0,
              "a terminated stage is forgotten and left no file (query %d)", rc);
        fprintf(report, "terminate: stopped\n");
    }

    /* Failures: named by errno, walked with the failed-stage calls, cleared by terminate. */
    CHECK(dw_stage_file_in(at(dw, "m.dat"), at(pfs, "missing.dat")) == -ENOENT,
          "a missing source is -ENOENT");
    CHECK(dw_stage_file_in("/tmp/not-a-bb-path", at(pfs, "in.dat")) == -EINVAL,
          "a path outside the burst buffer is -EINVAL");
    CHECK(dw_query_file_stage(at(dw, "out/dir/x.txt"), &complete, NULL, NULL, NULL) == 0,
          "a file of a directory stage has a stage");
    CHECK(dw_query_file_stage(at(dw, "never.txt"), NULL, NULL, NULL, NULL) == -ENOENT,
          "a query of a file that does not exist is -ENOENT");
    write_text(at(dw, "unstaged.txt"), "u\n");
    CHECK(dw_query_file_stage(at(dw, "unstaged.txt"), NULL, NULL, NULL, NULL) == -EINVAL,
          "a query of a file never staged is -EINVAL");
    CHECK(dw_stage_file_out(at(dw, "unstaged.txt"), at(pfs, "x"), 7) == -EINVAL,
          "an unknown stage_type is -EINVAL");

    write_text(at(dw, "bad.txt"), "cannot land\n");
    /* The PFS destination's parent is a regular file: the copy fails with ENOTDIR. */
    rc = dw_stage_file_out(at(dw, "bad.txt"), at(pfs, "blocker/bad.txt"), DW_STAGE_IMMEDIATE);
    CHECK(rc == 0, "starting a stage-out that will fail returned %d", rc);
    rc = dw_wait_file_stage(at(dw, "bad.txt"));
    CHECK(rc == -ENOTDIR, "waiting for a failed stage returned %d", rc);
    rc = dw_query_file_stage(at(dw, "bad.txt"), &complete, &pending, &deferred, &failed);
    CHECK(rc == 0 && failed == 1, "query of the failed stage: rc %d failed %d", rc, failed);
    dw_failed_stage_t *h = NULL;
    char path[4096];
    int err = 0, seen = 0;
    CHECK(dw_open_failed_stage(dw, &h) == 0, "dw_open_failed_stage");
    while ((rc = dw_read_failed_stage(h, path, sizeof path, &err)) > 0) {
        fprintf(report, "failed %s %d\n", path, err);
        CHECK(strcmp(path, at(dw, "bad.txt")) == 0 && err == -ENOTDIR && rc == (int)strlen(path),
              "failed stage %s errno %d", path, err);
        seen++;
    }
    CHECK(rc == 0 && seen == 1, "the walk ends after %d entries with %d", seen, rc);
    CHECK(dw_close_failed_stage(h) == 0, "dw_close_failed_stage");
    CHECK(dw_terminate_file_stage(at(dw, "bad.txt")) == 0, "terminating the failed stage");
    CHECK(dw_open_failed_stage(dw, &h) == 0 && dw_read_failed_stage(h, path, sizeof path, &err) == 0,
          "a terminated failure is gone");
    dw_close_failed_stage(h);

    fprintf(report, "failures %d\n", failures);
    fclose(report);
    return failures ? 1 : 0;
}
