/* surge_mpiio: the MPI-IO backend of `surge bench io` (IOR's aiori-MPIIO is the model).
 *
 * Started by `surge bench io --backend mpiio` under mpirun, one process per rank. One
 * repetition: a write phase and/or a read phase, each behind MPI_Barrier, each timed per rank
 * with CLOCK_MONOTONIC (comparable across the ranks of one host, as the POSIX backend's).
 *
 * Layout (IOR's): shared file DIR/data.shared, segment s of rank r at (s*procs + r)*block; or
 * file per process DIR/data.<r> (opened on MPI_COMM_SELF), segment s at s*block. Transfers of
 * TRANSFER bytes, with MPI_File_write_at_all / read_at_all (collective, IOR -c) or
 * MPI_File_write_at / read_at (independent). With reordering (IOR -C) rank r reads rank r+1's
 * data. Hints: the file named by $ROMIO_HINTS ("key value" per line, as ROMIO reads it) is
 * also passed as MPI_Info to MPI_File_open, so implementations that do not read the file (Open
 * MPI's OMPIO) see them; the hints the implementation reports after open are printed.
 *
 * Output (rank 0, stdout): one JSON line per phase, {"phase":..,"info":{..},"ranks":[..]},
 * each rank as surge_bench::result::RankResult (latencies in its histogram's wire form: 32
 * buckets per power of two).
 *
 * Arguments: DIR TRANSFER BLOCK SEGMENTS SHARED COLLECTIVE WRITE READ REORDER FSYNC
 */
#define _GNU_SOURCE
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUB_BITS 5
#define SUB (1ULL << SUB_BITS)
#define BUCKETS (((64 - SUB_BITS) + 1) * SUB)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The same bucket index as surge_bench::histogram::index_of. */
static unsigned bucket(uint64_t v) {
    if (v < 2 * SUB)
        return (unsigned)v;
    unsigned e = 63 - (unsigned)__builtin_clzll(v);
    uint64_t sub = (v >> (e - SUB_BITS)) - SUB;
    return (unsigned)((e - SUB_BITS + 1) * SUB + sub);
}

/* Per-rank figures, gathered to rank 0: ops bytes start io_start io_end end sum min max. */
enum { F_OPS, F_BYTES, F_START, F_IOSTART, F_IOEND, F_END, F_SUM, F_MIN, F_MAX, F_N };

static void die(int rank, const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "surge_mpiio: rank %d: %s: %s\n", rank, what, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static MPI_Info hints_from_env(void) {
    MPI_Info info;
    MPI_Info_create(&info);
    const char *path = getenv("ROMIO_HINTS");
    if (!path || !*path)
        return info;
    FILE *f = fopen(path, "r");
    if (!f)
        return info;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char key[256], val[512];
        if (line[0] == '#')
            continue;
        if (sscanf(line, "%255s %511s", key, val) == 2)
            MPI_Info_set(info, key, val);
    }
    fclose(f);
    return info;
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        if ((unsigned char)*s >= 0x20)
            putchar(*s);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, procs;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &procs);
    if (argc != 11) {
        if (rank == 0)
            fprintf(stderr, "usage: surge_mpiio DIR TRANSFER BLOCK SEGMENTS SHARED COLLECTIVE "
                            "WRITE READ REORDER FSYNC\n");
        MPI_Finalize();
        return 2;
    }
    const char *dir = argv[1];
    uint64_t transfer = strtoull(argv[2], 0, 10), block = strtoull(argv[3], 0, 10);
    uint64_t segments = strtoull(argv[4], 0, 10);
    int shared = atoi(argv[5]), collective = atoi(argv[6]);
    int do_write = atoi(argv[7]), do_read = atoi(argv[8]), reorder = atoi(argv[9]);
    int fsync_close = atoi(argv[10]);
    if (transfer == 0 || block % transfer != 0 || transfer > (1ULL << 30)) {
        if (rank == 0)
            fprintf(stderr, "surge_mpiio: bad transfer %llu / block %llu\n",
                    (unsigned long long)transfer, (unsigned long long)block);
        MPI_Finalize();
        return 2;
    }
    char *buf = malloc(transfer);
    if (!buf) {
        fprintf(stderr, "surge_mpiio: rank %d: cannot allocate %llu bytes\n", rank,
                (unsigned long long)transfer);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    uint64_t *hist = calloc(BUCKETS, sizeof *hist);
    uint64_t *all_hist = rank == 0 ? calloc((size_t)BUCKETS * procs, sizeof *hist) : NULL;
    uint64_t fig[F_N], *all_fig = rank == 0 ? calloc((size_t)F_N * procs, sizeof *fig) : NULL;
    MPI_Info info = hints_from_env();

    for (int ph = 0; ph < 2; ph++) {
        int writing = ph == 0;
        if ((writing && !do_write) || (!writing && !do_read))
            continue;
        /* Read-only runs read what a write laid out before (the parent runs it untimed). */
        int owner = (!writing && reorder) ? (rank + 1) % procs : rank;
        char path[4096];
        if (shared)
            snprintf(path, sizeof path, "%s/data.shared", dir);
        else
            snprintf(path, sizeof path, "%s/data.%d", dir, owner);
        memset(hist, 0, BUCKETS * sizeof *hist);
        for (uint64_t i = 0; i < transfer; i++)
            buf[i] = (char)(rank + i);
        uint64_t ops = 0, bytes = 0, sum = 0, min = UINT64_MAX, max = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        uint64_t t0 = now_ns();
        MPI_File fh;
        int amode = writing ? (MPI_MODE_CREATE | MPI_MODE_WRONLY) : MPI_MODE_RDONLY;
        int rc = MPI_File_open(shared ? MPI_COMM_WORLD : MPI_COMM_SELF, path, amode, info, &fh);
        if (rc != MPI_SUCCESS)
            die(rank, path, rc);
        uint64_t t1 = now_ns();
        for (uint64_t s = 0; s < segments; s++) {
            uint64_t base = shared ? (s * procs + owner) * block : s * block;
            for (uint64_t off = 0; off < block; off += transfer) {
                MPI_Status st;
                uint64_t a = now_ns();
                if (writing)
                    rc = collective ? MPI_File_write_at_all(fh, base + off, buf, (int)transfer,
                                                            MPI_BYTE, &st)
                                    : MPI_File_write_at(fh, base + off, buf, (int)transfer,
                                                        MPI_BYTE, &st);
                else
                    rc = collective ? MPI_File_read_at_all(fh, base + off, buf, (int)transfer,
                                                           MPI_BYTE, &st)
                                    : MPI_File_read_at(fh, base + off, buf, (int)transfer,
                                                       MPI_BYTE, &st);
                uint64_t lat = now_ns() - a;
                if (rc != MPI_SUCCESS)
                    die(rank, writing ? "write" : "read", rc);
                hist[bucket(lat)]++;
                sum += lat;
                if (lat < min)
                    min = lat;
                if (lat > max)
                    max = lat;
                ops++;
                bytes += transfer;
            }
        }
        uint64_t t2 = now_ns();
        if (writing && fsync_close) {
            rc = MPI_File_sync(fh);
            if (rc != MPI_SUCCESS)
                die(rank, "sync", rc);
        }
        MPI_Info used;
        MPI_File_get_info(fh, &used);
        rc = MPI_File_close(&fh);
        if (rc != MPI_SUCCESS)
            die(rank, "close", rc);
        uint64_t t3 = now_ns();
        uint64_t f[F_N] = {ops, bytes, t0, t1, t2, t3, sum, ops ? min : 0, max};
        memcpy(fig, f, sizeof f);
        MPI_Gather(fig, F_N, MPI_UINT64_T, all_fig, F_N, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        MPI_Gather(hist, BUCKETS, MPI_UINT64_T, all_hist, BUCKETS, MPI_UINT64_T, 0,
                   MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"phase\":\"%s\",\"info\":{", writing ? "write" : "read");
            int nkeys = 0, printed = 0;
            MPI_Info_get_nkeys(used, &nkeys);
            for (int k = 0; k < nkeys; k++) {
                char key[MPI_MAX_INFO_KEY + 1], val[1024];
                int flag = 0;
                MPI_Info_get_nthkey(used, k, key);
                MPI_Info_get(used, key, sizeof val - 1, val, &flag);
                if (!flag)
                    continue;
                if (printed++)
                    putchar(',');
                json_string(key);
                putchar(':');
                json_string(val);
            }
            printf("},\"ranks\":[");
            for (int r = 0; r < procs; r++) {
                uint64_t *g = all_fig + (size_t)r * F_N, *h = all_hist + (size_t)r * BUCKETS;
                printf("%s{\"rank\":%d,\"ops\":%llu,\"bytes\":%llu,\"start_ns\":%llu,"
                       "\"io_start_ns\":%llu,\"io_end_ns\":%llu,\"end_ns\":%llu,"
                       "\"stonewalled\":false,\"verify_errors\":0,\"latency\":{\"count\":%llu,"
                       "\"sum\":%llu,\"min\":%llu,\"max\":%llu,\"buckets\":[",
                       r ? "," : "", r, (unsigned long long)g[F_OPS],
                       (unsigned long long)g[F_BYTES], (unsigned long long)g[F_START],
                       (unsigned long long)g[F_IOSTART], (unsigned long long)g[F_IOEND],
                       (unsigned long long)g[F_END], (unsigned long long)g[F_OPS],
                       (unsigned long long)g[F_SUM], (unsigned long long)g[F_MIN],
                       (unsigned long long)g[F_MAX]);
                int first = 1;
                for (unsigned b = 0; b < BUCKETS; b++)
                    if (h[b]) {
                        printf("%s[%u,%llu]", first ? "" : ",", b, (unsigned long long)h[b]);
                        first = 0;
                    }
                printf("]}}");
            }
            printf("]}\n");
            fflush(stdout);
        }
        MPI_Info_free(&used);
    }
    MPI_Info_free(&info);
    free(buf);
    free(hist);
    free(all_hist);
    free(all_fig);
    MPI_Finalize();
    return 0;
}
