/*
 * The on-disk layout of one process's record file, shared by the shim (which writes it through
 * an mmap) and documented for the Rust reader (crates/surge-profile/src/records.rs), which reads
 * the field offsets and the counter names from the header itself rather than trusting a copy of
 * this file. Little-endian, 64-bit fields, fixed offsets. Bump SURGE_REC_VERSION on any change.
 */
#ifndef SURGE_SHIM_H
#define SURGE_SHIM_H

#include <stdint.h>

#define SURGE_REC_MAGIC 0x3152504547525553ULL /* "SURGEPR1" little-endian */
#define SURGE_REC_VERSION 1u

#define SURGE_HEADER_SIZE 8192u
#define SURGE_MAX_RECORDS 16384u /* record 0 is the overflow record "<other files>" */
#define SURGE_PATH_ARENA (4u << 20)
#define SURGE_NBINS 512u
#define SURGE_BIN_FIELDS 4u /* bytes_read, bytes_written, data_ops, meta_ops */
#define SURGE_FIRST_BIN_NS 10000000ull /* 10 ms, doubled as the run grows */
#define SURGE_HIST_BUCKETS 10u

/* File kinds, from st_mode (or MISSING when the path did not exist). */
enum surge_kind {
    SK_UNKNOWN = 0,
    SK_REG = 1,
    SK_DIR = 2,
    SK_CHR = 3,
    SK_BLK = 4,
    SK_FIFO = 5,
    SK_SOCK = 6,
    SK_LNK = 7,
    SK_MISSING = 8,
};

/*
 * Per-file counters. Names are written into the header (SURGE_COUNTER_NAMES) in this order;
 * the reader maps them by name. Times are nanoseconds, timestamps CLOCK_MONOTONIC nanoseconds.
 */
#define SURGE_COUNTERS(X)                                                                          \
    X(OPENS, "opens")                                                                              \
    X(CLOSES, "closes")                                                                            \
    X(READS, "reads")                                                                              \
    X(WRITES, "writes")                                                                            \
    X(BYTES_READ, "bytes_read")                                                                    \
    X(BYTES_WRITTEN, "bytes_written")                                                              \
    X(SEEKS, "seeks")                                                                              \
    X(STATS, "stats")                                                                              \
    X(SYNCS, "syncs")                                                                              \
    X(UNLINKS, "unlinks")                                                                          \
    X(RENAMES, "renames")                                                                          \
    X(MKDIRS, "mkdirs")                                                                            \
    X(RMDIRS, "rmdirs")                                                                            \
    X(OPENDIRS, "opendirs")                                                                        \
    X(READDIRS, "readdirs")                                                                        \
    X(ACCESSES, "accesses")                                                                        \
    X(META_ERRORS, "meta_errors")                                                                  \
    X(STDIO_OPENS, "stdio_opens")                                                                  \
    X(STDIO_CLOSES, "stdio_closes")                                                                \
    X(STDIO_READS, "stdio_reads")                                                                  \
    X(STDIO_WRITES, "stdio_writes")                                                                \
    X(STDIO_BYTES_READ, "stdio_bytes_read")                                                        \
    X(STDIO_BYTES_WRITTEN, "stdio_bytes_written")                                                  \
    X(STDIO_SEEKS, "stdio_seeks")                                                                  \
    X(STDIO_FLUSHES, "stdio_flushes")                                                              \
    X(STDIO_KERNEL_READS, "stdio_kernel_reads_est")                                                \
    X(STDIO_KERNEL_WRITES, "stdio_kernel_writes_est")                                              \
    X(READ_TIME, "read_time_ns")                                                                   \
    X(WRITE_TIME, "write_time_ns")                                                                 \
    X(META_TIME, "meta_time_ns")                                                                   \
    X(SYNC_TIME, "sync_time_ns")                                                                   \
    X(SMALL_TIME, "small_data_time_ns") /* transfers of at most 100 KiB, and syncs */                                                            \
    X(LARGE_TIME, "large_data_time_ns")                                                            \
    X(FIRST_TS, "first_ns")                                                                        \
    X(LAST_TS, "last_ns")                                                                          \
    X(FIRST_READ_TS, "first_read_ns")                                                              \
    X(FIRST_WRITE_TS, "first_write_ns")                                                            \
    X(MAX_BYTE_READ, "max_byte_read")                                                              \
    X(MAX_BYTE_WRITTEN, "max_byte_written")                                                        \
    X(SIZE_SEEN, "size_seen")                                                                      \
    X(H_R0, "hist_read_0_100")                                                                     \
    X(H_R1, "hist_read_100_1k")                                                                    \
    X(H_R2, "hist_read_1k_10k")                                                                    \
    X(H_R3, "hist_read_10k_100k")                                                                  \
    X(H_R4, "hist_read_100k_1m")                                                                   \
    X(H_R5, "hist_read_1m_4m")                                                                     \
    X(H_R6, "hist_read_4m_10m")                                                                    \
    X(H_R7, "hist_read_10m_100m")                                                                  \
    X(H_R8, "hist_read_100m_1g")                                                                   \
    X(H_R9, "hist_read_1g_plus")                                                                   \
    X(H_W0, "hist_write_0_100")                                                                    \
    X(H_W1, "hist_write_100_1k")                                                                   \
    X(H_W2, "hist_write_1k_10k")                                                                   \
    X(H_W3, "hist_write_10k_100k")                                                                 \
    X(H_W4, "hist_write_100k_1m")                                                                  \
    X(H_W5, "hist_write_1m_4m")                                                                    \
    X(H_W6, "hist_write_4m_10m")                                                                   \
    X(H_W7, "hist_write_10m_100m")                                                                 \
    X(H_W8, "hist_write_100m_1g")                                                                  \
    X(H_W9, "hist_write_1g_plus")

#define SURGE_ENUM(id, name) C_##id,
enum surge_counter { SURGE_COUNTERS(SURGE_ENUM) SURGE_NCOUNTERS };
#undef SURGE_ENUM

/* One file (path) as seen by one process. */
struct surge_rec {
    uint64_t hash;     /* FNV-1a of the path, 0 = free slot */
    uint32_t path_off; /* into the path arena */
    uint32_t path_len;
    uint32_t kind; /* enum surge_kind */
    uint32_t pad;
    uint64_t c[SURGE_NCOUNTERS];
};

/* The header at offset 0 of the record file. */
struct surge_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint32_t record_size;
    uint32_t max_records;
    uint32_t ncounters;
    uint32_t nbins;
    uint64_t records_off; /* file offset of record 0 */
    uint64_t arena_off;   /* file offset of the path arena */
    uint64_t bins_off;    /* file offset of the timeline bins */
    int32_t pid;
    int32_t ppid;
    uint64_t start_mono_ns;
    uint64_t start_real_ns;
    uint64_t last_mono_ns; /* updated on every recorded call: the end time of a crashed process */
    uint64_t end_mono_ns;  /* set by the exit handler or before exec */
    uint32_t ended;        /* 0 = no exit handler ran (crash, signal, _exit), 1 = exit, 2 = exec */
    uint32_t n_records;    /* records in use, including record 0 */
    uint64_t arena_used;
    uint64_t peak_rss_kib; /* VmHWM at exit or exec */
    uint32_t threads_peak;    /* most threads alive at once (counted through pthread_create) */
    uint32_t io_threads;      /* distinct threads that made a recorded call */
    uint64_t bin_width_ns;
    uint64_t dropped_paths; /* calls attributed to record 0 because the table was full */
    char exe[512];
    char cmdline[2048];
    char counter_names[2048]; /* comma-separated, in counter order */
};

#endif
