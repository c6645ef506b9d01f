/*
 * libsurge_shim: the LD_PRELOAD interposition library behind `surge profile`.
 *
 * Job: count, per process and per file, the POSIX and stdio calls a program makes (Darshan-style
 * named counters, see surge_shim.h), with the time spent in data and metadata calls, a transfer
 * size histogram and an I/O timeline. Nothing else: merging, tables and verdicts are Rust.
 *
 * Design, and why:
 * - Counters live in a per-process file mapped MAP_SHARED in $SURGE_PROFILE_DIR. Every update
 *   lands in the page cache at once, so a process that crashes, is killed or calls _exit still
 *   leaves a complete record; the exit handler only adds peak memory and a clean-exit flag.
 * - Counters are updated with relaxed atomics; one mutex guards only the path table (taken on
 *   path-based calls and on the first use of an unknown fd). A thread-local guard makes nested or
 *   signal-handler calls pass straight through, so the shim never deadlocks on itself.
 * - fork: an atfork child handler gives the child its own record file and re-registers the fds
 *   it inherited; exec: the new image loads the shim again (LD_PRELOAD is inherited) and starts a
 *   new file, the old one is marked "ended by exec".
 * - The shim's own file operations are raw syscalls, so they are never counted.
 * - With SURGE_PROFILE_DIR unset, every wrapper is a plain pass-through.
 */
#define _GNU_SOURCE
#define _LARGEFILE64_SOURCE
#include "surge_shim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* With optimisation, glibc defines these as macros; the shim needs the functions. */
#undef fread_unlocked
#undef fwrite_unlocked
#undef fgetc
#undef fputc

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))

_Static_assert(offsetof(struct surge_header, pid) == 56, "header layout");
_Static_assert(offsetof(struct surge_header, ended) == 96, "header layout");
_Static_assert(offsetof(struct surge_header, bin_width_ns) == 128, "header layout");
_Static_assert(offsetof(struct surge_header, exe) == 144, "header layout");
_Static_assert(offsetof(struct surge_header, counter_names) == 2704, "header layout");
_Static_assert(sizeof(struct surge_header) <= SURGE_HEADER_SIZE, "header size");
_Static_assert(offsetof(struct surge_rec, c) == 24, "record layout");

#define RECORDS_OFF ((uint64_t)SURGE_HEADER_SIZE)
#define BINS_OFF (RECORDS_OFF + (uint64_t)SURGE_MAX_RECORDS * sizeof(struct surge_rec))
#define ARENA_OFF (BINS_OFF + (uint64_t)SURGE_NBINS * SURGE_BIN_FIELDS * 8u)
#define MAP_BYTES (ARENA_OFF + (uint64_t)SURGE_PATH_ARENA)
#define HASH_SLOTS (SURGE_MAX_RECORDS * 2u)
#define SMALL_IO_BYTES (100u * 1024u) /* Darshan's 100K bucket edge: up to it, IOPS matter */

/* One entry per open fd: which record it belongs to and where its offset is. */
struct fd_slot {
    uint32_t rec; /* record index + 1; 0 = unknown fd */
    uint32_t blksize;
    uint64_t offset;
    uint64_t stdio_pending_r; /* bytes buffered by stdio since the last estimated kernel call */
    uint64_t stdio_pending_w;
};

static struct surge_header *hdr;
static struct surge_rec *recs;
static uint64_t *bins;
static char *arena;
static uint32_t *hash_slots; /* record index + 1, anonymous memory, rebuilt after fork */
static struct fd_slot *fds;
static int fd_cap;
static char out_dir[PATH_MAX];
static char cwd[PATH_MAX];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static TLS int in_shim;
static TLS int thread_registered;
/* Threads alive now; the header keeps the peak (Daley's "compute threads"). */
static uint32_t live_threads = 1;

/* ---------------------------------------------------------------- real functions */

#define REAL(ret, name, args)                                                                      \
    static ret(*real_##name) args;                                                                 \
    static ret(*get_##name(void)) args {                                                           \
        if (!real_##name)                                                                          \
            real_##name = (ret(*) args)dlsym(RTLD_NEXT, #name);                                    \
        return real_##name;                                                                        \
    }

/* Pre-2.33 stat entry points exist in glibc 2.36 only as versioned compat symbols. */
#define REAL_COMPAT(ret, name, args)                                                               \
    static ret(*real_##name) args;                                                                 \
    static ret(*get_##name(void)) args {                                                           \
        if (!real_##name) {                                                                        \
            real_##name = (ret(*) args)dlvsym(RTLD_NEXT, #name, "GLIBC_2.2.5");                    \
            if (!real_##name)                                                                      \
                real_##name = (ret(*) args)dlsym(RTLD_NEXT, #name);                                \
        }                                                                                          \
        return real_##name;                                                                        \
    }

REAL(int, open, (const char *, int, ...))
REAL(int, open64, (const char *, int, ...))
REAL(int, openat, (int, const char *, int, ...))
REAL(int, openat64, (int, const char *, int, ...))
REAL(int, __open_2, (const char *, int))
REAL(int, __open64_2, (const char *, int))
REAL(int, __openat_2, (int, const char *, int))
REAL(int, __openat64_2, (int, const char *, int))
REAL(int, creat, (const char *, mode_t))
REAL(int, creat64, (const char *, mode_t))
REAL(int, close, (int))
REAL(int, dup, (int))
REAL(int, dup2, (int, int))
REAL(int, dup3, (int, int, int))
REAL(ssize_t, read, (int, void *, size_t))
REAL(ssize_t, __read_chk, (int, void *, size_t, size_t))
REAL(ssize_t, write, (int, const void *, size_t))
REAL(ssize_t, pread, (int, void *, size_t, off_t))
REAL(ssize_t, pread64, (int, void *, size_t, off64_t))
REAL(ssize_t, __pread_chk, (int, void *, size_t, off_t, size_t))
REAL(ssize_t, __pread64_chk, (int, void *, size_t, off64_t, size_t))
REAL(ssize_t, pwrite, (int, const void *, size_t, off_t))
REAL(ssize_t, pwrite64, (int, const void *, size_t, off64_t))
REAL(ssize_t, readv, (int, const struct iovec *, int))
REAL(ssize_t, writev, (int, const struct iovec *, int))
REAL(ssize_t, preadv, (int, const struct iovec *, int, off_t))
REAL(ssize_t, preadv64, (int, const struct iovec *, int, off64_t))
REAL(ssize_t, pwritev, (int, const struct iovec *, int, off_t))
REAL(ssize_t, pwritev64, (int, const struct iovec *, int, off64_t))
REAL(ssize_t, preadv2, (int, const struct iovec *, int, off_t, int))
REAL(ssize_t, preadv64v2, (int, const struct iovec *, int, off64_t, int))
REAL(ssize_t, pwritev2, (int, const struct iovec *, int, off_t, int))
REAL(ssize_t, pwritev64v2, (int, const struct iovec *, int, off64_t, int))
REAL(off_t, lseek, (int, off_t, int))
REAL(off64_t, lseek64, (int, off64_t, int))
REAL(int, fsync, (int))
REAL(int, fdatasync, (int))
REAL(int, stat, (const char *, struct stat *))
REAL(int, stat64, (const char *, struct stat64 *))
REAL(int, lstat, (const char *, struct stat *))
REAL(int, lstat64, (const char *, struct stat64 *))
REAL(int, fstat, (int, struct stat *))
REAL(int, fstat64, (int, struct stat64 *))
REAL(int, fstatat, (int, const char *, struct stat *, int))
REAL(int, fstatat64, (int, const char *, struct stat64 *, int))
REAL(int, statx, (int, const char *, int, unsigned int, struct statx *))
REAL_COMPAT(int, __xstat, (int, const char *, struct stat *))
REAL_COMPAT(int, __xstat64, (int, const char *, struct stat64 *))
REAL_COMPAT(int, __lxstat, (int, const char *, struct stat *))
REAL_COMPAT(int, __lxstat64, (int, const char *, struct stat64 *))
REAL_COMPAT(int, __fxstat, (int, int, struct stat *))
REAL_COMPAT(int, __fxstat64, (int, int, struct stat64 *))
REAL_COMPAT(int, __fxstatat, (int, int, const char *, struct stat *, int))
REAL_COMPAT(int, __fxstatat64, (int, int, const char *, struct stat64 *, int))
REAL(int, access, (const char *, int))
REAL(int, faccessat, (int, const char *, int, int))
REAL(int, euidaccess, (const char *, int))
REAL(int, unlink, (const char *))
REAL(int, unlinkat, (int, const char *, int))
REAL(int, rename, (const char *, const char *))
REAL(int, renameat, (int, const char *, int, const char *))
REAL(int, renameat2, (int, const char *, int, const char *, unsigned int))
REAL(int, mkdir, (const char *, mode_t))
REAL(int, mkdirat, (int, const char *, mode_t))
REAL(int, rmdir, (const char *))
REAL(DIR *, opendir, (const char *))
REAL(DIR *, fdopendir, (int))
REAL(struct dirent *, readdir, (DIR *))
REAL(struct dirent64 *, readdir64, (DIR *))
REAL(int, closedir, (DIR *))
REAL(int, chdir, (const char *))
REAL(int, fchdir, (int))
REAL(FILE *, fopen, (const char *, const char *))
REAL(FILE *, fopen64, (const char *, const char *))
REAL(FILE *, fdopen, (int, const char *))
REAL(FILE *, freopen, (const char *, const char *, FILE *))
REAL(FILE *, freopen64, (const char *, const char *, FILE *))
REAL(int, fclose, (FILE *))
REAL(size_t, fread, (void *, size_t, size_t, FILE *))
REAL(size_t, fread_unlocked, (void *, size_t, size_t, FILE *))
REAL(size_t, fwrite, (const void *, size_t, size_t, FILE *))
REAL(size_t, fwrite_unlocked, (const void *, size_t, size_t, FILE *))
REAL(char *, fgets, (char *, int, FILE *))
REAL(int, fputs, (const char *, FILE *))
REAL(int, fgetc, (FILE *))
REAL(int, fputc, (int, FILE *))
REAL(int, vfprintf, (FILE *, const char *, va_list))
REAL(int, __vfprintf_chk, (FILE *, int, const char *, va_list))
REAL(int, fseek, (FILE *, long, int))
REAL(int, fseeko, (FILE *, off_t, int))
REAL(int, fseeko64, (FILE *, off64_t, int))
REAL(int, fflush, (FILE *))
REAL(int, pthread_create, (pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))
REAL(int, execve, (const char *, char *const[], char *const[]))
REAL(int, execv, (const char *, char *const[]))
REAL(int, execvp, (const char *, char *const[]))
REAL(int, execvpe, (const char *, char *const[], char *const[]))

/* ---------------------------------------------------------------- small helpers */

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void add(struct surge_rec *r, int c, uint64_t v) {
    __atomic_fetch_add(&r->c[c], v, __ATOMIC_RELAXED);
}

static inline void store_max(uint64_t *p, uint64_t v) {
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static inline void store_max32(uint32_t *p, uint32_t v) {
    uint32_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* Minimum, treating 0 as "not set yet". */
static inline void store_min_set(uint64_t *p, uint64_t v) {
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while ((cur == 0 || v < cur) &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static int sys_open(const char *p, int flags, int mode) {
    return (int)syscall(SYS_openat, AT_FDCWD, p, flags | O_CLOEXEC, mode);
}

static ssize_t sys_read_all(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = syscall(SYS_read, fd, buf + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static uint32_t kind_of(mode_t m) {
    switch (m & S_IFMT) {
    case S_IFREG: return SK_REG;
    case S_IFDIR: return SK_DIR;
    case S_IFCHR: return SK_CHR;
    case S_IFBLK: return SK_BLK;
    case S_IFIFO: return SK_FIFO;
    case S_IFSOCK: return SK_SOCK;
    case S_IFLNK: return SK_LNK;
    default: return SK_UNKNOWN;
    }
}

/* Darshan's size buckets, upper edges inclusive: 0-100 holds 0..=100, 100K-1M holds 1 MiB. */
static unsigned bucket_of(uint64_t n) {
    static const uint64_t edges[] = {100,         1024,         10240,         102400,
                                     1048576,     4194304,      10485760,      104857600,
                                     1073741824};
    unsigned i = 0;
    while (i < 9 && n > edges[i])
        i++;
    return i;
}

/* glibc marks path arguments nonnull, but callers do pass NULL with AT_EMPTY_PATH: keep the test. */
__attribute__((noinline)) static int empty_path(const char *p) { return !p || !p[0]; }

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ? h : 1;
}

/* Lexically normalises an absolute path in place: collapses "//", "/./" and "x/../". */
static size_t normalize(char *p) {
    size_t n = strlen(p), w = 0;
    for (size_t r = 0; r < n;) {
        if (p[r] == '/') {
            while (r < n && p[r] == '/')
                r++;
            size_t s = r;
            while (r < n && p[r] != '/')
                r++;
            size_t len = r - s;
            if (len == 0 || (len == 1 && p[s] == '.'))
                continue;
            if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
                while (w > 0 && p[w - 1] != '/')
                    w--;
                if (w > 0)
                    w--;
                continue;
            }
            p[w++] = '/';
            memmove(p + w, p + s, len);
            w += len;
        } else {
            r++; /* not reached for absolute paths */
        }
    }
    if (w == 0)
        p[w++] = '/';
    p[w] = 0;
    return w;
}

/* ---------------------------------------------------------------- records */

static void timeline(uint64_t t, int field, uint64_t v) {
    if (!hdr || t < hdr->start_mono_ns)
        return;
    uint64_t dt = t - hdr->start_mono_ns;
    uint64_t w = __atomic_load_n(&hdr->bin_width_ns, __ATOMIC_RELAXED);
    if (dt / w >= SURGE_NBINS) {
        /* Rare (log2 of the run length): merge bin pairs and double the width. */
        pthread_mutex_lock(&table_lock);
        w = hdr->bin_width_ns;
        while (dt / w >= SURGE_NBINS) {
            for (unsigned i = 0; i < SURGE_NBINS / 2; i++)
                for (unsigned f = 0; f < SURGE_BIN_FIELDS; f++)
                    bins[i * SURGE_BIN_FIELDS + f] = bins[2 * i * SURGE_BIN_FIELDS + f] +
                                                     bins[(2 * i + 1) * SURGE_BIN_FIELDS + f];
            memset(bins + (SURGE_NBINS / 2) * SURGE_BIN_FIELDS, 0,
                   (SURGE_NBINS / 2) * SURGE_BIN_FIELDS * 8);
            w *= 2;
        }
        __atomic_store_n(&hdr->bin_width_ns, w, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&table_lock);
    }
    __atomic_fetch_add(&bins[(dt / w) * SURGE_BIN_FIELDS + field], v, __ATOMIC_RELAXED);
}

/* Finds or creates the record of an absolute path. Caller holds table_lock. */
static uint32_t intern_locked(const char *path, size_t len, uint32_t kind) {
    uint64_t h = fnv1a(path, len);
    uint32_t slot = (uint32_t)(h % HASH_SLOTS);
    for (uint32_t probe = 0; probe < HASH_SLOTS; probe++) {
        uint32_t idx1 = hash_slots[slot];
        if (idx1 == 0)
            break;
        struct surge_rec *r = &recs[idx1 - 1];
        if (r->hash == h && r->path_len == len && memcmp(arena + r->path_off, path, len) == 0) {
            if (kind != SK_UNKNOWN && (r->kind == SK_UNKNOWN || r->kind == SK_MISSING))
                r->kind = kind;
            return idx1 - 1;
        }
        slot = (slot + 1) % HASH_SLOTS;
    }
    if (hdr->n_records >= SURGE_MAX_RECORDS || hdr->arena_used + len + 1 > SURGE_PATH_ARENA) {
        hdr->dropped_paths++;
        return 0;
    }
    uint32_t idx = hdr->n_records;
    struct surge_rec *r = &recs[idx];
    memcpy(arena + hdr->arena_used, path, len);
    arena[hdr->arena_used + len] = 0;
    r->path_off = (uint32_t)hdr->arena_used;
    r->path_len = (uint32_t)len;
    r->kind = kind;
    hdr->arena_used += len + 1;
    __atomic_store_n(&r->hash, h, __ATOMIC_RELEASE);
    __atomic_store_n(&hdr->n_records, idx + 1, __ATOMIC_RELEASE);
    hash_slots[slot] = idx + 1;
    return idx;
}

static uint32_t intern(const char *path, size_t len, uint32_t kind) {
    pthread_mutex_lock(&table_lock);
    uint32_t idx = intern_locked(path, len, kind);
    pthread_mutex_unlock(&table_lock);
    return idx;
}

static const char *fd_path(int fd);

/* Turns (dirfd, path) into an absolute, normalised path in buf. */
static size_t absolute(int dirfd, const char *path, char *buf, size_t cap) {
    if (!path)
        return 0;
    if (path[0] == '/') {
        snprintf(buf, cap, "%s", path);
    } else {
        const char *base = cwd;
        if (dirfd != AT_FDCWD) {
            base = fd_path(dirfd);
            if (!base)
                base = "/<unknown-dir>";
        }
        snprintf(buf, cap, "%s/%s", base, path);
    }
    return normalize(buf);
}

static uint32_t rec_for_path(int dirfd, const char *path, uint32_t kind) {
    char buf[PATH_MAX * 2];
    size_t n = absolute(dirfd, path, buf, sizeof buf);
    if (n == 0)
        return 0;
    return intern(buf, n, kind);
}

/* Names an fd the program did not open through us (inherited, pipe, socket, dup...). */
static uint32_t rec_for_unknown_fd(int fd) {
    struct stat st;
    uint32_t kind = SK_UNKNOWN;
    if (syscall(SYS_fstat, fd, &st) == 0)
        kind = kind_of(st.st_mode);
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, link, target, sizeof target - 1);
    if (n <= 0)
        n = snprintf(target, sizeof target, "<fd %d>", fd);
    target[n] = 0;
    uint32_t idx = intern(target, (size_t)n, kind);
    if (kind == SK_REG)
        store_max(&recs[idx].c[C_SIZE_SEEN], (uint64_t)st.st_size);
    return idx;
}

static struct fd_slot *slot_of(int fd) {
    if (fd < 0 || fd >= fd_cap)
        return NULL;
    return &fds[fd];
}

static const char *fd_path(int fd) {
    struct fd_slot *s = slot_of(fd);
    if (!s || s->rec == 0)
        return NULL;
    struct surge_rec *r = &recs[s->rec - 1];
    return arena + r->path_off;
}

/* The record of an fd, registering it on first use. */
static struct surge_rec *rec_of_fd(int fd, struct fd_slot **out) {
    struct fd_slot *s = slot_of(fd);
    if (out)
        *out = s;
    if (!s)
        return &recs[0];
    if (s->rec == 0) {
        s->rec = rec_for_unknown_fd(fd) + 1;
        s->offset = 0;
        s->blksize = 4096;
    }
    return &recs[s->rec - 1];
}

static void register_thread(void) {
    if (!thread_registered) {
        thread_registered = 1;
        __atomic_fetch_add(&hdr->io_threads, 1, __ATOMIC_RELAXED);
    }
}

static void touch(struct surge_rec *r, uint64_t t0, uint64_t t1) {
    store_min_set(&r->c[C_FIRST_TS], t0);
    store_max(&r->c[C_LAST_TS], t1);
    __atomic_store_n(&hdr->last_mono_ns, t1, __ATOMIC_RELAXED);
    register_thread();
}

/* A metadata call on record r (counter c), failed or not. */
static void meta(struct surge_rec *r, int c, int failed, uint64_t t0, uint64_t t1) {
    add(r, c, 1);
    if (failed)
        add(r, C_META_ERRORS, 1);
    add(r, C_META_TIME, t1 - t0);
    touch(r, t0, t1);
    timeline(t0, 3, 1);
}

/* A data call of n bytes (n < 0: failed) ending at file offset end. */
static void data(struct surge_rec *r, int is_write, ssize_t n, uint64_t end, uint64_t t0, uint64_t t1) {
    uint64_t bytes = n > 0 ? (uint64_t)n : 0;
    add(r, is_write ? C_WRITES : C_READS, 1);
    add(r, is_write ? C_BYTES_WRITTEN : C_BYTES_READ, bytes);
    add(r, is_write ? C_WRITE_TIME : C_READ_TIME, t1 - t0);
    add(r, bytes <= SMALL_IO_BYTES ? C_SMALL_TIME : C_LARGE_TIME, t1 - t0);
    add(r, (is_write ? C_H_W0 : C_H_R0) + (int)bucket_of(bytes), 1);
    /* First read/write: the first that moved data (SQLite probes a new, empty file first). */
    if (bytes > 0) {
        store_max(&r->c[is_write ? C_MAX_BYTE_WRITTEN : C_MAX_BYTE_READ], end);
        store_min_set(&r->c[is_write ? C_FIRST_WRITE_TS : C_FIRST_READ_TS], t0);
    }
    touch(r, t0, t1);
    timeline(t0, is_write ? 1 : 0, bytes);
    timeline(t0, 2, 1);
}

/* ---------------------------------------------------------------- process lifecycle */

static void read_proc_text(const char *path, char *buf, size_t cap, int nul_to_space) {
    int fd = sys_open(path, O_RDONLY, 0);
    if (fd < 0) {
        buf[0] = 0;
        return;
    }
    ssize_t n = sys_read_all(fd, buf, cap - 1);
    syscall(SYS_close, fd);
    if (n < 0)
        n = 0;
    buf[n] = 0;
    if (nul_to_space)
        for (ssize_t i = 0; i + 1 < n; i++)
            if (buf[i] == 0)
                buf[i] = ' ';
}

static uint64_t peak_rss_kib(void) {
    char buf[4096];
    read_proc_text("/proc/self/status", buf, sizeof buf, 0);
    char *p = strstr(buf, "VmHWM:");
    return p ? strtoull(p + 6, NULL, 10) : 0;
}

static void finish(uint32_t how) {
    if (!hdr)
        return;
    hdr->peak_rss_kib = peak_rss_kib();
    hdr->end_mono_ns = now_ns();
    __atomic_store_n(&hdr->ended, how, __ATOMIC_RELEASE);
}

/* Maps a fresh record file for this process. Returns 0 on success. */
static int open_record_file(void) {
    char path[PATH_MAX + 64];
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(path, sizeof path, "%s/p%d-%llu-%d.surgerec", out_dir, (int)getpid(),
                 (unsigned long long)now_ns(), attempt);
        fd = sys_open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
        if (fd < 0 && errno != EEXIST)
            return -1;
    }
    if (fd < 0)
        return -1;
    if (syscall(SYS_ftruncate, fd, (off_t)MAP_BYTES) != 0) {
        syscall(SYS_close, fd);
        return -1;
    }
    void *m = mmap(NULL, MAP_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    syscall(SYS_close, fd);
    if (m == MAP_FAILED)
        return -1;
    struct surge_header *h = m;
    h->version = SURGE_REC_VERSION;
    h->header_size = SURGE_HEADER_SIZE;
    h->record_size = sizeof(struct surge_rec);
    h->max_records = SURGE_MAX_RECORDS;
    h->ncounters = SURGE_NCOUNTERS;
    h->nbins = SURGE_NBINS;
    h->records_off = RECORDS_OFF;
    h->arena_off = ARENA_OFF;
    h->bins_off = BINS_OFF;
    h->pid = (int32_t)getpid();
    h->ppid = (int32_t)getppid();
    h->start_mono_ns = now_ns();
    h->start_real_ns = real_ns();
    h->last_mono_ns = h->start_mono_ns;
    h->bin_width_ns = SURGE_FIRST_BIN_NS;
    h->threads_peak = 1;
    h->io_threads = 0;
    ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/exe", h->exe, sizeof h->exe - 1);
    h->exe[n > 0 ? n : 0] = 0;
    read_proc_text("/proc/self/cmdline", h->cmdline, sizeof h->cmdline, 1);
    size_t off = 0;
#define SURGE_NAME(id, name) off += (size_t)snprintf(h->counter_names + off, sizeof h->counter_names - off, "%s%s", off ? "," : "", name);
    SURGE_COUNTERS(SURGE_NAME)
#undef SURGE_NAME
    struct surge_header *old = hdr;
    recs = (struct surge_rec *)((char *)m + RECORDS_OFF);
    bins = (uint64_t *)((char *)m + BINS_OFF);
    arena = (char *)m + ARENA_OFF;
    memset(hash_slots, 0, HASH_SLOTS * sizeof *hash_slots);
    /* Record 0 collects what does not fit in the table. */
    const char *other = "<other files>";
    memcpy(arena, other, strlen(other) + 1);
    recs[0].path_off = 0;
    recs[0].path_len = (uint32_t)strlen(other);
    recs[0].hash = fnv1a(other, strlen(other));
    h->arena_used = strlen(other) + 1;
    h->n_records = 1;
    __atomic_store_n(&h->magic, SURGE_REC_MAGIC, __ATOMIC_RELEASE);
    hdr = h;
    if (old)
        munmap(old, MAP_BYTES);
    return 0;
}

static void refresh_cwd(void) {
    if (syscall(SYS_getcwd, cwd, sizeof cwd) <= 0)
        snprintf(cwd, sizeof cwd, "/<unknown-cwd>");
}

static void atfork_prepare(void) { pthread_mutex_lock(&table_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&table_lock); }

static void atfork_child(void) {
    pthread_mutex_init(&table_lock, NULL);
    if (!hdr)
        return;
    struct surge_header *parent = hdr;
    char *parent_arena = arena;
    struct surge_rec *parent_recs = recs;
    char path[PATH_MAX];
    /* With hdr NULL, open_record_file leaves the parent's mapping alone: it is still needed to
     * name the inherited fds below. */
    hdr = NULL;
    if (open_record_file() != 0) {
        munmap(parent, MAP_BYTES);
        recs = NULL;
        return;
    }
    /* Only the forking thread lives on in the child. */
    live_threads = 1;
    thread_registered = 0;
    for (int fd = 0; fd < fd_cap; fd++) {
        if (fds[fd].rec == 0)
            continue;
        struct surge_rec *pr = &parent_recs[fds[fd].rec - 1];
        size_t len = pr->path_len < sizeof path - 1 ? pr->path_len : sizeof path - 1;
        memcpy(path, parent_arena + pr->path_off, len);
        path[len] = 0;
        fds[fd].rec = intern_locked(path, len, pr->kind) + 1;
    }
    munmap(parent, MAP_BYTES);
}

__attribute__((constructor)) static void shim_init(void) {
    const char *dir = getenv("SURGE_PROFILE_DIR");
    if (!dir || !*dir || strlen(dir) >= sizeof out_dir)
        return;
    snprintf(out_dir, sizeof out_dir, "%s", dir);
    struct rlimit rl;
    fd_cap = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 65536)
        fd_cap = rl.rlim_cur < 1024 ? 1024 : (int)rl.rlim_cur;
    void *f = mmap(NULL, (size_t)fd_cap * sizeof *fds, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *s = mmap(NULL, HASH_SLOTS * sizeof *hash_slots, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f == MAP_FAILED || s == MAP_FAILED)
        return;
    fds = f;
    hash_slots = s;
    refresh_cwd();
    if (open_record_file() != 0)
        return;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

__attribute__((destructor)) static void shim_fini(void) { finish(1); }

/* ---------------------------------------------------------------- wrapper scaffolding */

/* True when this call should be recorded; sets the re-entrancy guard. */
#define ENTER() (hdr && !in_shim ? (in_shim = 1) : 0)
#define LEAVE() (in_shim = 0)

static void after_open(int dirfd, const char *path, int fd, int flags, uint64_t t0, uint64_t t1,
                       int counter) {
    int saved = errno;
    struct stat st;
    uint32_t kind = fd >= 0 ? SK_UNKNOWN : (saved == ENOENT ? SK_MISSING : SK_UNKNOWN);
    int have_st = fd >= 0 && syscall(SYS_fstat, fd, &st) == 0;
    if (have_st)
        kind = kind_of(st.st_mode);
    uint32_t idx = rec_for_path(dirfd, path, kind);
    struct surge_rec *r = &recs[idx];
    meta(r, counter, fd < 0, t0, t1);
    if (have_st && kind == SK_REG)
        store_max(&r->c[C_SIZE_SEEN], (uint64_t)st.st_size);
    struct fd_slot *s = slot_of(fd);
    if (s) {
        s->rec = idx + 1;
        s->offset = (flags & O_APPEND) && have_st ? (uint64_t)st.st_size : 0;
        s->blksize = have_st && st.st_blksize > 0 ? (uint32_t)st.st_blksize : 4096;
        s->stdio_pending_r = s->stdio_pending_w = 0;
    }
    errno = saved;
}

static void after_stat_path(int dirfd, const char *path, int ret, const struct stat *st,
                            uint64_t t0, uint64_t t1) {
    int saved = errno;
    uint32_t kind = ret == 0 ? kind_of(st->st_mode) : (saved == ENOENT ? SK_MISSING : SK_UNKNOWN);
    struct surge_rec *r = &recs[rec_for_path(dirfd, path, kind)];
    meta(r, C_STATS, ret != 0, t0, t1);
    if (ret == 0 && kind == SK_REG)
        store_max(&r->c[C_SIZE_SEEN], (uint64_t)st->st_size);
    errno = saved;
}

static void after_stat_fd(int fd, int ret, const struct stat *st, uint64_t t0, uint64_t t1) {
    int saved = errno;
    struct surge_rec *r = rec_of_fd(fd, NULL);
    meta(r, C_STATS, ret != 0, t0, t1);
    if (ret == 0 && S_ISREG(st->st_mode))
        store_max(&r->c[C_SIZE_SEEN], (uint64_t)st->st_size);
    errno = saved;
}

static void after_path_meta(int dirfd, const char *path, int counter, int ret, uint32_t kind,
                            uint64_t t0, uint64_t t1) {
    int saved = errno;
    if (ret != 0)
        kind = saved == ENOENT ? SK_MISSING : SK_UNKNOWN;
    meta(&recs[rec_for_path(dirfd, path, kind)], counter, ret != 0, t0, t1);
    errno = saved;
}

/* A read or write through an fd; off < 0 means "at the fd's current offset". */
static void after_rw(int fd, int is_write, ssize_t n, int64_t off, uint64_t t0, uint64_t t1) {
    int saved = errno;
    struct fd_slot *s;
    struct surge_rec *r = rec_of_fd(fd, &s);
    uint64_t start = off >= 0 ? (uint64_t)off : (s ? s->offset : 0);
    uint64_t end = start + (n > 0 ? (uint64_t)n : 0);
    if (off < 0 && s)
        s->offset = end;
    data(r, is_write, n, end, t0, t1);
    errno = saved;
}

/* ---------------------------------------------------------------- open / close / dup */

#define OPEN_MODE(flags, mode)                                                                     \
    do {                                                                                           \
        if ((flags) & (O_CREAT | __O_TMPFILE)) {                                                   \
            va_list ap;                                                                            \
            va_start(ap, flags);                                                                   \
            mode = va_arg(ap, int);                                                                \
            va_end(ap);                                                                            \
        }                                                                                          \
    } while (0)

#define WRAP_OPEN(name)                                                                            \
    EXPORT int name(const char *path, int flags, ...) {                                            \
        int mode = 0;                                                                              \
        OPEN_MODE(flags, mode);                                                                    \
        if (!ENTER())                                                                              \
            return get_##name()(path, flags, mode);                                                \
        uint64_t t0 = now_ns();                                                                    \
        int fd = get_##name()(path, flags, mode);                                                  \
        uint64_t t1 = now_ns();                                                                    \
        after_open(AT_FDCWD, path, fd, flags, t0, t1, C_OPENS);                                    \
        LEAVE();                                                                                   \
        return fd;                                                                                 \
    }
WRAP_OPEN(open)
WRAP_OPEN(open64)

#define WRAP_OPENAT(name)                                                                          \
    EXPORT int name(int dirfd, const char *path, int flags, ...) {                                 \
        int mode = 0;                                                                              \
        OPEN_MODE(flags, mode);                                                                    \
        if (!ENTER())                                                                              \
            return get_##name()(dirfd, path, flags, mode);                                         \
        uint64_t t0 = now_ns();                                                                    \
        int fd = get_##name()(dirfd, path, flags, mode);                                           \
        uint64_t t1 = now_ns();                                                                    \
        after_open(dirfd, path, fd, flags, t0, t1, C_OPENS);                                       \
        LEAVE();                                                                                   \
        return fd;                                                                                 \
    }
WRAP_OPENAT(openat)
WRAP_OPENAT(openat64)

#define WRAP_OPEN2(name)                                                                           \
    EXPORT int name(const char *path, int flags) {                                                 \
        if (!ENTER())                                                                              \
            return get_##name()(path, flags);                                                      \
        uint64_t t0 = now_ns();                                                                    \
        int fd = get_##name()(path, flags);                                                        \
        uint64_t t1 = now_ns();                                                                    \
        after_open(AT_FDCWD, path, fd, flags, t0, t1, C_OPENS);                                    \
        LEAVE();                                                                                   \
        return fd;                                                                                 \
    }
WRAP_OPEN2(__open_2)
WRAP_OPEN2(__open64_2)

#define WRAP_OPENAT2(name)                                                                         \
    EXPORT int name(int dirfd, const char *path, int flags) {                                      \
        if (!ENTER())                                                                              \
            return get_##name()(dirfd, path, flags);                                               \
        uint64_t t0 = now_ns();                                                                    \
        int fd = get_##name()(dirfd, path, flags);                                                 \
        uint64_t t1 = now_ns();                                                                    \
        after_open(dirfd, path, fd, flags, t0, t1, C_OPENS);                                       \
        LEAVE();                                                                                   \
        return fd;                                                                                 \
    }
WRAP_OPENAT2(__openat_2)
WRAP_OPENAT2(__openat64_2)

#define WRAP_CREAT(name)                                                                           \
    EXPORT int name(const char *path, mode_t mode) {                                               \
        if (!ENTER())                                                                              \
            return get_##name()(path, mode);                                                       \
        uint64_t t0 = now_ns();                                                                    \
        int fd = get_##name()(path, mode);                                                         \
        uint64_t t1 = now_ns();                                                                    \
        after_open(AT_FDCWD, path, fd, O_CREAT | O_WRONLY | O_TRUNC, t0, t1, C_OPENS);             \
        LEAVE();                                                                                   \
        return fd;                                                                                 \
    }
WRAP_CREAT(creat)
WRAP_CREAT(creat64)

EXPORT int close(int fd) {
    if (!ENTER())
        return get_close()(fd);
    struct fd_slot *s;
    struct surge_rec *r = rec_of_fd(fd, &s);
    uint64_t t0 = now_ns();
    int ret = get_close()(fd);
    uint64_t t1 = now_ns();
    int saved = errno;
    meta(r, C_CLOSES, ret != 0, t0, t1);
    if (s)
        memset(s, 0, sizeof *s);
    errno = saved;
    LEAVE();
    return ret;
}

/* dup'd fds share the original's record (and, approximately, its offset). */
static void copy_slot(int from, int to) {
    struct fd_slot *a = slot_of(from), *b = slot_of(to);
    if (a && b)
        *b = *a;
}

EXPORT int dup(int fd) {
    int r = get_dup()(fd);
    if (r >= 0 && hdr)
        copy_slot(fd, r);
    return r;
}

EXPORT int dup2(int fd, int fd2) {
    int r = get_dup2()(fd, fd2);
    if (r >= 0 && hdr && fd != fd2)
        copy_slot(fd, r);
    return r;
}

EXPORT int dup3(int fd, int fd2, int flags) {
    int r = get_dup3()(fd, fd2, flags);
    if (r >= 0 && hdr)
        copy_slot(fd, r);
    return r;
}

/* ---------------------------------------------------------------- read / write */

#define WRAP_RW(name, is_write, buft)                                                              \
    EXPORT ssize_t name(int fd, buft buf, size_t n) {                                              \
        if (!ENTER())                                                                              \
            return get_##name()(fd, buf, n);                                                       \
        uint64_t t0 = now_ns();                                                                    \
        ssize_t r = get_##name()(fd, buf, n);                                                      \
        uint64_t t1 = now_ns();                                                                    \
        after_rw(fd, is_write, r, -1, t0, t1);                                                     \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_RW(read, 0, void *)
WRAP_RW(write, 1, const void *)

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
    if (!ENTER())
        return get___read_chk()(fd, buf, n, buflen);
    uint64_t t0 = now_ns();
    ssize_t r = get___read_chk()(fd, buf, n, buflen);
    uint64_t t1 = now_ns();
    after_rw(fd, 0, r, -1, t0, t1);
    LEAVE();
    return r;
}

#define WRAP_PRW(name, is_write, buft, offt)                                                       \
    EXPORT ssize_t name(int fd, buft buf, size_t n, offt off) {                                    \
        if (!ENTER())                                                                              \
            return get_##name()(fd, buf, n, off);                                                  \
        uint64_t t0 = now_ns();                                                                    \
        ssize_t r = get_##name()(fd, buf, n, off);                                                 \
        uint64_t t1 = now_ns();                                                                    \
        after_rw(fd, is_write, r, off < 0 ? 0 : (int64_t)off, t0, t1);                             \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_PRW(pread, 0, void *, off_t)
WRAP_PRW(pread64, 0, void *, off64_t)
WRAP_PRW(pwrite, 1, const void *, off_t)
WRAP_PRW(pwrite64, 1, const void *, off64_t)

#define WRAP_PRW_CHK(name, offt)                                                                   \
    EXPORT ssize_t name(int fd, void *buf, size_t n, offt off, size_t buflen) {                    \
        if (!ENTER())                                                                              \
            return get_##name()(fd, buf, n, off, buflen);                                          \
        uint64_t t0 = now_ns();                                                                    \
        ssize_t r = get_##name()(fd, buf, n, off, buflen);                                         \
        uint64_t t1 = now_ns();                                                                    \
        after_rw(fd, 0, r, off < 0 ? 0 : (int64_t)off, t0, t1);                                    \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_PRW_CHK(__pread_chk, off_t)
WRAP_PRW_CHK(__pread64_chk, off64_t)

#define WRAP_RWV(name, is_write)                                                                   \
    EXPORT ssize_t name(int fd, const struct iovec *iov, int cnt) {                                \
        if (!ENTER())                                                                              \
            return get_##name()(fd, iov, cnt);                                                     \
        uint64_t t0 = now_ns();                                                                    \
        ssize_t r = get_##name()(fd, iov, cnt);                                                    \
        uint64_t t1 = now_ns();                                                                    \
        after_rw(fd, is_write, r, -1, t0, t1);                                                     \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_RWV(readv, 0)
WRAP_RWV(writev, 1)

#define WRAP_PRWV(name, is_write, offt)                                                            \
    EXPORT ssize_t name(int fd, const struct iovec *iov, int cnt, offt off) {                      \
        if (!ENTER())                                                                              \
            return get_##name()(fd, iov, cnt, off);                                                \
        uint64_t t0 = now_ns();                                                                    \
        ssize_t r = get_##name()(fd, iov, cnt, off);                                               \
        uint64_t t1 = now_ns();                                                                    \
        after_rw(fd, is_write, r, off < 0 ? -1 : (int64_t)off, t0, t1);                            \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_PRWV(preadv, 0, off_t)
WRAP_PRWV(preadv64, 0, off64_t)
WRAP_PRWV(pwritev, 1, off_t)
WRAP_PRWV(pwritev64, 1, off64_t)

#define WRAP_PRWV2(name, is_write, offt)                                                           \
    EXPORT ssize_t name(int fd, const struct iovec *iov, int cnt, offt off, int fl) {              \
        if (!ENTER())                                                                              \
            return get_##name()(fd, iov, cnt, off, fl);                                            \
        uint64_t t0 = now_ns();                                                                    \
        ssize_t r = get_##name()(fd, iov, cnt, off, fl);                                           \
        uint64_t t1 = now_ns();                                                                    \
        /* off == -1 means "current offset" for the v2 calls. */                                   \
        after_rw(fd, is_write, r, off < 0 ? -1 : (int64_t)off, t0, t1);                            \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_PRWV2(preadv2, 0, off_t)
WRAP_PRWV2(preadv64v2, 0, off64_t)
WRAP_PRWV2(pwritev2, 1, off_t)
WRAP_PRWV2(pwritev64v2, 1, off64_t)

#define WRAP_LSEEK(name, offt)                                                                     \
    EXPORT offt name(int fd, offt off, int whence) {                                               \
        if (!ENTER())                                                                              \
            return get_##name()(fd, off, whence);                                                  \
        uint64_t t0 = now_ns();                                                                    \
        offt r = get_##name()(fd, off, whence);                                                    \
        uint64_t t1 = now_ns();                                                                    \
        int saved = errno;                                                                         \
        struct fd_slot *s;                                                                         \
        struct surge_rec *rec = rec_of_fd(fd, &s);                                                 \
        add(rec, C_SEEKS, 1);                                                                      \
        touch(rec, t0, t1);                                                                        \
        if (s && r >= 0)                                                                           \
            s->offset = (uint64_t)r;                                                               \
        errno = saved;                                                                             \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_LSEEK(lseek, off_t)
WRAP_LSEEK(lseek64, off64_t)

#define WRAP_SYNC(name)                                                                            \
    EXPORT int name(int fd) {                                                                      \
        if (!ENTER())                                                                              \
            return get_##name()(fd);                                                               \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(fd);                                                                  \
        uint64_t t1 = now_ns();                                                                    \
        int saved = errno;                                                                         \
        struct surge_rec *rec = rec_of_fd(fd, NULL);                                               \
        add(rec, C_SYNCS, 1);                                                                      \
        add(rec, C_SYNC_TIME, t1 - t0);                                                            \
        /* A sync is latency-bound like a small write (IOR's fsyncPerWrite): IOPS class. */        \
        add(rec, C_SMALL_TIME, t1 - t0);                                                           \
        touch(rec, t0, t1);                                                                        \
        timeline(t0, 2, 1);                                                                        \
        errno = saved;                                                                             \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_SYNC(fsync)
WRAP_SYNC(fdatasync)

/* ---------------------------------------------------------------- stat family */

#define WRAP_STAT_PATH(name, stt)                                                                  \
    EXPORT int name(const char *path, stt *st) {                                                   \
        if (!ENTER())                                                                              \
            return get_##name()(path, st);                                                         \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(path, st);                                                            \
        uint64_t t1 = now_ns();                                                                    \
        after_stat_path(AT_FDCWD, path, r, (const struct stat *)st, t0, t1);                       \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_STAT_PATH(stat, struct stat)
WRAP_STAT_PATH(stat64, struct stat64)
WRAP_STAT_PATH(lstat, struct stat)
WRAP_STAT_PATH(lstat64, struct stat64)

#define WRAP_STAT_FD(name, stt)                                                                    \
    EXPORT int name(int fd, stt *st) {                                                             \
        if (!ENTER())                                                                              \
            return get_##name()(fd, st);                                                           \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(fd, st);                                                              \
        uint64_t t1 = now_ns();                                                                    \
        after_stat_fd(fd, r, (const struct stat *)st, t0, t1);                                     \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_STAT_FD(fstat, struct stat)
WRAP_STAT_FD(fstat64, struct stat64)

/* fstatat with AT_EMPTY_PATH and "" is an fstat of dirfd. */
#define WRAP_STATAT(name, stt)                                                                     \
    EXPORT int name(int dirfd, const char *path, stt *st, int flags) {                             \
        if (!ENTER())                                                                              \
            return get_##name()(dirfd, path, st, flags);                                           \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(dirfd, path, st, flags);                                              \
        uint64_t t1 = now_ns();                                                                    \
        if ((flags & AT_EMPTY_PATH) && empty_path(path))                                           \
            after_stat_fd(dirfd, r, (const struct stat *)st, t0, t1);                              \
        else                                                                                       \
            after_stat_path(dirfd, path, r, (const struct stat *)st, t0, t1);                      \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_STATAT(fstatat, struct stat)
WRAP_STATAT(fstatat64, struct stat64)

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *stx) {
    if (!ENTER())
        return get_statx()(dirfd, path, flags, mask, stx);
    uint64_t t0 = now_ns();
    int r = get_statx()(dirfd, path, flags, mask, stx);
    uint64_t t1 = now_ns();
    struct stat st;
    memset(&st, 0, sizeof st);
    if (r == 0) {
        st.st_mode = stx->stx_mode;
        st.st_size = (off_t)stx->stx_size;
    }
    if ((flags & AT_EMPTY_PATH) && empty_path(path))
        after_stat_fd(dirfd, r, &st, t0, t1);
    else
        after_stat_path(dirfd, path, r, &st, t0, t1);
    LEAVE();
    return r;
}

#define WRAP_XSTAT_PATH(name, stt)                                                                 \
    EXPORT int name(int ver, const char *path, stt *st) {                                          \
        if (!ENTER())                                                                              \
            return get_##name()(ver, path, st);                                                    \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(ver, path, st);                                                       \
        uint64_t t1 = now_ns();                                                                    \
        after_stat_path(AT_FDCWD, path, r, (const struct stat *)st, t0, t1);                       \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_XSTAT_PATH(__xstat, struct stat)
WRAP_XSTAT_PATH(__xstat64, struct stat64)
WRAP_XSTAT_PATH(__lxstat, struct stat)
WRAP_XSTAT_PATH(__lxstat64, struct stat64)

#define WRAP_FXSTAT(name, stt)                                                                     \
    EXPORT int name(int ver, int fd, stt *st) {                                                    \
        if (!ENTER())                                                                              \
            return get_##name()(ver, fd, st);                                                      \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(ver, fd, st);                                                         \
        uint64_t t1 = now_ns();                                                                    \
        after_stat_fd(fd, r, (const struct stat *)st, t0, t1);                                     \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_FXSTAT(__fxstat, struct stat)
WRAP_FXSTAT(__fxstat64, struct stat64)

#define WRAP_FXSTATAT(name, stt)                                                                   \
    EXPORT int name(int ver, int dirfd, const char *path, stt *st, int flags) {                    \
        if (!ENTER())                                                                              \
            return get_##name()(ver, dirfd, path, st, flags);                                      \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(ver, dirfd, path, st, flags);                                         \
        uint64_t t1 = now_ns();                                                                    \
        after_stat_path(dirfd, path, r, (const struct stat *)st, t0, t1);                          \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_FXSTATAT(__fxstatat, struct stat)
WRAP_FXSTATAT(__fxstatat64, struct stat64)

/* ---------------------------------------------------------------- path metadata calls */

EXPORT int access(const char *path, int mode) {
    if (!ENTER())
        return get_access()(path, mode);
    uint64_t t0 = now_ns();
    int r = get_access()(path, mode);
    uint64_t t1 = now_ns();
    after_path_meta(AT_FDCWD, path, C_ACCESSES, r, SK_UNKNOWN, t0, t1);
    LEAVE();
    return r;
}

EXPORT int euidaccess(const char *path, int mode) {
    if (!ENTER())
        return get_euidaccess()(path, mode);
    uint64_t t0 = now_ns();
    int r = get_euidaccess()(path, mode);
    uint64_t t1 = now_ns();
    after_path_meta(AT_FDCWD, path, C_ACCESSES, r, SK_UNKNOWN, t0, t1);
    LEAVE();
    return r;
}

EXPORT int faccessat(int dirfd, const char *path, int mode, int flags) {
    if (!ENTER())
        return get_faccessat()(dirfd, path, mode, flags);
    uint64_t t0 = now_ns();
    int r = get_faccessat()(dirfd, path, mode, flags);
    uint64_t t1 = now_ns();
    after_path_meta(dirfd, path, C_ACCESSES, r, SK_UNKNOWN, t0, t1);
    LEAVE();
    return r;
}

EXPORT int unlink(const char *path) {
    if (!ENTER())
        return get_unlink()(path);
    uint64_t t0 = now_ns();
    int r = get_unlink()(path);
    uint64_t t1 = now_ns();
    after_path_meta(AT_FDCWD, path, C_UNLINKS, r, SK_UNKNOWN, t0, t1);
    LEAVE();
    return r;
}

EXPORT int unlinkat(int dirfd, const char *path, int flags) {
    if (!ENTER())
        return get_unlinkat()(dirfd, path, flags);
    uint64_t t0 = now_ns();
    int r = get_unlinkat()(dirfd, path, flags);
    uint64_t t1 = now_ns();
    after_path_meta(dirfd, path, (flags & AT_REMOVEDIR) ? C_RMDIRS : C_UNLINKS, r, SK_UNKNOWN, t0,
                    t1);
    LEAVE();
    return r;
}

EXPORT int rmdir(const char *path) {
    if (!ENTER())
        return get_rmdir()(path);
    uint64_t t0 = now_ns();
    int r = get_rmdir()(path);
    uint64_t t1 = now_ns();
    after_path_meta(AT_FDCWD, path, C_RMDIRS, r, SK_DIR, t0, t1);
    LEAVE();
    return r;
}

EXPORT int mkdir(const char *path, mode_t mode) {
    if (!ENTER())
        return get_mkdir()(path, mode);
    uint64_t t0 = now_ns();
    int r = get_mkdir()(path, mode);
    uint64_t t1 = now_ns();
    after_path_meta(AT_FDCWD, path, C_MKDIRS, r, SK_DIR, t0, t1);
    LEAVE();
    return r;
}

EXPORT int mkdirat(int dirfd, const char *path, mode_t mode) {
    if (!ENTER())
        return get_mkdirat()(dirfd, path, mode);
    uint64_t t0 = now_ns();
    int r = get_mkdirat()(dirfd, path, mode);
    uint64_t t1 = now_ns();
    after_path_meta(dirfd, path, C_MKDIRS, r, SK_DIR, t0, t1);
    LEAVE();
    return r;
}

/* A rename is one metadata call, counted on the source; the target is only marked as touched. */
static void after_rename(int d1, const char *from, int d2, const char *to, int r, uint64_t t0,
                         uint64_t t1) {
    int saved = errno;
    after_path_meta(d1, from, C_RENAMES, r, SK_UNKNOWN, t0, t1);
    touch(&recs[rec_for_path(d2, to, SK_UNKNOWN)], t0, t1);
    errno = saved;
}

EXPORT int rename(const char *from, const char *to) {
    if (!ENTER())
        return get_rename()(from, to);
    uint64_t t0 = now_ns();
    int r = get_rename()(from, to);
    uint64_t t1 = now_ns();
    after_rename(AT_FDCWD, from, AT_FDCWD, to, r, t0, t1);
    LEAVE();
    return r;
}

EXPORT int renameat(int d1, const char *from, int d2, const char *to) {
    if (!ENTER())
        return get_renameat()(d1, from, d2, to);
    uint64_t t0 = now_ns();
    int r = get_renameat()(d1, from, d2, to);
    uint64_t t1 = now_ns();
    after_rename(d1, from, d2, to, r, t0, t1);
    LEAVE();
    return r;
}

EXPORT int renameat2(int d1, const char *from, int d2, const char *to, unsigned int flags) {
    if (!ENTER())
        return get_renameat2()(d1, from, d2, to, flags);
    uint64_t t0 = now_ns();
    int r = get_renameat2()(d1, from, d2, to, flags);
    uint64_t t1 = now_ns();
    after_rename(d1, from, d2, to, r, t0, t1);
    LEAVE();
    return r;
}

EXPORT int chdir(const char *path) {
    int r = get_chdir()(path);
    if (r == 0 && hdr)
        refresh_cwd();
    return r;
}

EXPORT int fchdir(int fd) {
    int r = get_fchdir()(fd);
    if (r == 0 && hdr)
        refresh_cwd();
    return r;
}

/* ---------------------------------------------------------------- directories */

static void after_opendir(const char *path, DIR *d, uint64_t t0, uint64_t t1) {
    int saved = errno;
    uint32_t kind = d ? SK_DIR : (saved == ENOENT ? SK_MISSING : SK_UNKNOWN);
    uint32_t idx = rec_for_path(AT_FDCWD, path, kind);
    meta(&recs[idx], C_OPENDIRS, d == NULL, t0, t1);
    if (d) {
        struct fd_slot *s = slot_of(dirfd(d));
        if (s) {
            memset(s, 0, sizeof *s);
            s->rec = idx + 1;
        }
    }
    errno = saved;
}

EXPORT DIR *opendir(const char *path) {
    if (!ENTER())
        return get_opendir()(path);
    uint64_t t0 = now_ns();
    DIR *d = get_opendir()(path);
    uint64_t t1 = now_ns();
    after_opendir(path, d, t0, t1);
    LEAVE();
    return d;
}

EXPORT DIR *fdopendir(int fd) {
    if (!ENTER())
        return get_fdopendir()(fd);
    uint64_t t0 = now_ns();
    DIR *d = get_fdopendir()(fd);
    uint64_t t1 = now_ns();
    int saved = errno;
    meta(rec_of_fd(fd, NULL), C_OPENDIRS, d == NULL, t0, t1);
    errno = saved;
    LEAVE();
    return d;
}

#define WRAP_READDIR(name, ent)                                                                    \
    EXPORT ent *name(DIR *d) {                                                                     \
        if (!ENTER())                                                                              \
            return get_##name()(d);                                                                \
        uint64_t t0 = now_ns();                                                                    \
        ent *e = get_##name()(d);                                                                  \
        uint64_t t1 = now_ns();                                                                    \
        int saved = errno;                                                                         \
        meta(rec_of_fd(dirfd(d), NULL), C_READDIRS, 0, t0, t1);                                    \
        errno = saved;                                                                             \
        LEAVE();                                                                                   \
        return e;                                                                                  \
    }
WRAP_READDIR(readdir, struct dirent)
WRAP_READDIR(readdir64, struct dirent64)

EXPORT int closedir(DIR *d) {
    if (!ENTER())
        return get_closedir()(d);
    int fd = dirfd(d);
    struct fd_slot *s;
    struct surge_rec *r = rec_of_fd(fd, &s);
    uint64_t t0 = now_ns();
    int ret = get_closedir()(d);
    uint64_t t1 = now_ns();
    int saved = errno;
    meta(r, C_CLOSES, ret != 0, t0, t1);
    if (s)
        memset(s, 0, sizeof *s);
    errno = saved;
    LEAVE();
    return ret;
}

/* ---------------------------------------------------------------- stdio */

/*
 * libc buffers stdio (Daley §3.3): many small fread calls become few large read syscalls, which
 * the shim cannot see (libc calls its internal read). The shim counts the library calls and
 * estimates the kernel calls from the buffer size (st_blksize): a call of at least one buffer goes
 * to the kernel directly, smaller ones are served from a buffer refilled every blksize bytes.
 */
static void stdio_after_open(const char *path, FILE *f, uint64_t t0, uint64_t t1) {
    int saved = errno;
    int fd = f ? fileno(f) : -1;
    after_open(AT_FDCWD, path, fd, 0, t0, t1, C_STDIO_OPENS);
    errno = saved;
}

#define WRAP_FOPEN(name)                                                                           \
    EXPORT FILE *name(const char *path, const char *mode) {                                        \
        if (!ENTER())                                                                              \
            return get_##name()(path, mode);                                                       \
        uint64_t t0 = now_ns();                                                                    \
        FILE *f = get_##name()(path, mode);                                                        \
        uint64_t t1 = now_ns();                                                                    \
        stdio_after_open(path, f, t0, t1);                                                         \
        LEAVE();                                                                                   \
        return f;                                                                                  \
    }
WRAP_FOPEN(fopen)
WRAP_FOPEN(fopen64)

#define WRAP_FREOPEN(name)                                                                         \
    EXPORT FILE *name(const char *path, const char *mode, FILE *old) {                             \
        if (!ENTER())                                                                              \
            return get_##name()(path, mode, old);                                                  \
        struct fd_slot *s = slot_of(old ? fileno(old) : -1);                                       \
        if (s)                                                                                     \
            memset(s, 0, sizeof *s);                                                               \
        uint64_t t0 = now_ns();                                                                    \
        FILE *f = get_##name()(path, mode, old);                                                   \
        uint64_t t1 = now_ns();                                                                    \
        if (path)                                                                                  \
            stdio_after_open(path, f, t0, t1);                                                     \
        LEAVE();                                                                                   \
        return f;                                                                                  \
    }
WRAP_FREOPEN(freopen)
WRAP_FREOPEN(freopen64)

EXPORT FILE *fdopen(int fd, const char *mode) {
    if (!ENTER())
        return get_fdopen()(fd, mode);
    uint64_t t0 = now_ns();
    FILE *f = get_fdopen()(fd, mode);
    uint64_t t1 = now_ns();
    int saved = errno;
    struct surge_rec *r = rec_of_fd(fd, NULL);
    add(r, C_STDIO_OPENS, 1);
    touch(r, t0, t1);
    errno = saved;
    LEAVE();
    return f;
}

EXPORT int fclose(FILE *f) {
    if (!ENTER())
        return get_fclose()(f);
    int fd = fileno(f);
    struct fd_slot *s;
    struct surge_rec *r = rec_of_fd(fd, &s);
    /* Whatever is still buffered goes out in one last kernel write. */
    if (s && s->stdio_pending_w > 0)
        add(r, C_STDIO_KERNEL_WRITES, 1);
    uint64_t t0 = now_ns();
    int ret = get_fclose()(f);
    uint64_t t1 = now_ns();
    int saved = errno;
    meta(r, C_STDIO_CLOSES, ret != 0, t0, t1);
    if (s)
        memset(s, 0, sizeof *s);
    errno = saved;
    LEAVE();
    return ret;
}

static void stdio_data(FILE *f, int is_write, size_t bytes, uint64_t t0, uint64_t t1) {
    int saved = errno;
    struct fd_slot *s;
    struct surge_rec *r = rec_of_fd(fileno(f), &s);
    add(r, is_write ? C_STDIO_WRITES : C_STDIO_READS, 1);
    add(r, is_write ? C_STDIO_BYTES_WRITTEN : C_STDIO_BYTES_READ, bytes);
    add(r, is_write ? C_WRITE_TIME : C_READ_TIME, t1 - t0);
    uint64_t blk = s && s->blksize ? s->blksize : 4096;
    uint64_t kernel = 0;
    if (bytes >= blk) {
        kernel = 1;
    } else if (s) {
        uint64_t *pending = is_write ? &s->stdio_pending_w : &s->stdio_pending_r;
        if (!is_write && *pending == 0 && bytes > 0)
            kernel = 1; /* the first small read fills the buffer */
        *pending += bytes;
        while (*pending >= blk) {
            *pending -= blk;
            kernel++;
        }
    }
    add(r, is_write ? C_STDIO_KERNEL_WRITES : C_STDIO_KERNEL_READS, kernel);
    /* The transfer size the storage sees is the kernel call's, not the library call's. */
    uint64_t ksize = bytes >= blk ? bytes : blk;
    add(r, ksize <= SMALL_IO_BYTES ? C_SMALL_TIME : C_LARGE_TIME, t1 - t0);
    if (kernel)
        add(r, (is_write ? C_H_W0 : C_H_R0) + (int)bucket_of(ksize), kernel);
    if (s) {
        s->offset += bytes;
        if (bytes > 0)
            store_max(&r->c[is_write ? C_MAX_BYTE_WRITTEN : C_MAX_BYTE_READ], s->offset);
    }
    if (bytes > 0)
        store_min_set(&r->c[is_write ? C_FIRST_WRITE_TS : C_FIRST_READ_TS], t0);
    touch(r, t0, t1);
    timeline(t0, is_write ? 1 : 0, bytes);
    timeline(t0, 2, 1);
    errno = saved;
}

#define WRAP_FREAD(name)                                                                           \
    EXPORT size_t name(void *p, size_t sz, size_t n, FILE *f) {                                    \
        if (!ENTER())                                                                              \
            return get_##name()(p, sz, n, f);                                                      \
        uint64_t t0 = now_ns();                                                                    \
        size_t r = get_##name()(p, sz, n, f);                                                      \
        uint64_t t1 = now_ns();                                                                    \
        stdio_data(f, 0, r * sz, t0, t1);                                                          \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_FREAD(fread)
WRAP_FREAD(fread_unlocked)

#define WRAP_FWRITE(name)                                                                          \
    EXPORT size_t name(const void *p, size_t sz, size_t n, FILE *f) {                              \
        if (!ENTER())                                                                              \
            return get_##name()(p, sz, n, f);                                                      \
        uint64_t t0 = now_ns();                                                                    \
        size_t r = get_##name()(p, sz, n, f);                                                      \
        uint64_t t1 = now_ns();                                                                    \
        stdio_data(f, 1, r * sz, t0, t1);                                                          \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_FWRITE(fwrite)
WRAP_FWRITE(fwrite_unlocked)

EXPORT char *fgets(char *s, int n, FILE *f) {
    if (!ENTER())
        return get_fgets()(s, n, f);
    uint64_t t0 = now_ns();
    char *r = get_fgets()(s, n, f);
    uint64_t t1 = now_ns();
    stdio_data(f, 0, r ? strlen(r) : 0, t0, t1);
    LEAVE();
    return r;
}

EXPORT int fputs(const char *s, FILE *f) {
    if (!ENTER())
        return get_fputs()(s, f);
    uint64_t t0 = now_ns();
    int r = get_fputs()(s, f);
    uint64_t t1 = now_ns();
    stdio_data(f, 1, r >= 0 ? strlen(s) : 0, t0, t1);
    LEAVE();
    return r;
}

EXPORT int fgetc(FILE *f) {
    if (!ENTER())
        return get_fgetc()(f);
    uint64_t t0 = now_ns();
    int r = get_fgetc()(f);
    uint64_t t1 = now_ns();
    stdio_data(f, 0, r == EOF ? 0 : 1, t0, t1);
    LEAVE();
    return r;
}

EXPORT int fputc(int c, FILE *f) {
    if (!ENTER())
        return get_fputc()(c, f);
    uint64_t t0 = now_ns();
    int r = get_fputc()(c, f);
    uint64_t t1 = now_ns();
    stdio_data(f, 1, r == EOF ? 0 : 1, t0, t1);
    LEAVE();
    return r;
}

EXPORT int vfprintf(FILE *f, const char *fmt, va_list ap) {
    if (!ENTER())
        return get_vfprintf()(f, fmt, ap);
    uint64_t t0 = now_ns();
    int r = get_vfprintf()(f, fmt, ap);
    uint64_t t1 = now_ns();
    stdio_data(f, 1, r > 0 ? (size_t)r : 0, t0, t1);
    LEAVE();
    return r;
}

EXPORT int fprintf(FILE *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vfprintf(f, fmt, ap);
    va_end(ap);
    return r;
}

EXPORT int __vfprintf_chk(FILE *f, int flag, const char *fmt, va_list ap) {
    if (!ENTER())
        return get___vfprintf_chk()(f, flag, fmt, ap);
    uint64_t t0 = now_ns();
    int r = get___vfprintf_chk()(f, flag, fmt, ap);
    uint64_t t1 = now_ns();
    stdio_data(f, 1, r > 0 ? (size_t)r : 0, t0, t1);
    LEAVE();
    return r;
}

EXPORT int __fprintf_chk(FILE *f, int flag, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = __vfprintf_chk(f, flag, fmt, ap);
    va_end(ap);
    return r;
}

static void stdio_seek(FILE *f, int r, uint64_t t0, uint64_t t1) {
    int saved = errno;
    struct fd_slot *s;
    struct surge_rec *rec = rec_of_fd(fileno(f), &s);
    add(rec, C_STDIO_SEEKS, 1);
    touch(rec, t0, t1);
    if (s && r == 0) {
        off_t pos = ftello(f);
        if (pos >= 0)
            s->offset = (uint64_t)pos;
        s->stdio_pending_r = 0; /* a seek drops the read buffer */
    }
    errno = saved;
}

#define WRAP_FSEEK(name, offt)                                                                     \
    EXPORT int name(FILE *f, offt off, int whence) {                                               \
        if (!ENTER())                                                                              \
            return get_##name()(f, off, whence);                                                   \
        uint64_t t0 = now_ns();                                                                    \
        int r = get_##name()(f, off, whence);                                                      \
        uint64_t t1 = now_ns();                                                                    \
        stdio_seek(f, r, t0, t1);                                                                  \
        LEAVE();                                                                                   \
        return r;                                                                                  \
    }
WRAP_FSEEK(fseek, long)
WRAP_FSEEK(fseeko, off_t)
WRAP_FSEEK(fseeko64, off64_t)

EXPORT int fflush(FILE *f) {
    if (!ENTER() || !f)
        return get_fflush()(f);
    uint64_t t0 = now_ns();
    int r = get_fflush()(f);
    uint64_t t1 = now_ns();
    int saved = errno;
    struct fd_slot *s;
    struct surge_rec *rec = rec_of_fd(fileno(f), &s);
    add(rec, C_STDIO_FLUSHES, 1);
    if (s && s->stdio_pending_w > 0) {
        add(rec, C_STDIO_KERNEL_WRITES, 1);
        s->stdio_pending_w = 0;
    }
    add(rec, C_WRITE_TIME, t1 - t0);
    touch(rec, t0, t1);
    errno = saved;
    LEAVE();
    return r;
}

/* ---------------------------------------------------------------- threads and exec */

struct trampoline_arg {
    void *(*fn)(void *);
    void *arg;
};

static void thread_gone(void *unused) {
    (void)unused;
    __atomic_fetch_sub(&live_threads, 1, __ATOMIC_RELAXED);
}

static void *trampoline(void *p) {
    struct trampoline_arg t = *(struct trampoline_arg *)p;
    free(p);
    void *r;
    /* The cleanup handler also runs on pthread_exit and cancellation. */
    pthread_cleanup_push(thread_gone, NULL);
    r = t.fn(t.arg);
    pthread_cleanup_pop(1);
    return r;
}

EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    struct trampoline_arg *ta = hdr ? malloc(sizeof *ta) : NULL;
    if (!ta)
        return get_pthread_create()(t, a, fn, arg);
    ta->fn = fn;
    ta->arg = arg;
    uint32_t now = __atomic_add_fetch(&live_threads, 1, __ATOMIC_RELAXED);
    int r = get_pthread_create()(t, a, trampoline, ta);
    if (r != 0) {
        __atomic_fetch_sub(&live_threads, 1, __ATOMIC_RELAXED);
        free(ta);
    } else if (hdr) {
        store_max32(&hdr->threads_peak, now);
    }
    return r;
}

/* exec replaces this image: close the record as "ended by exec"; reopen it if exec fails. */
static void before_exec(void) { finish(2); }
static void exec_failed(void) {
    if (hdr)
        __atomic_store_n(&hdr->ended, 0, __ATOMIC_RELEASE);
}

EXPORT int execve(const char *p, char *const argv[], char *const envp[]) {
    before_exec();
    int r = get_execve()(p, argv, envp);
    exec_failed();
    return r;
}

EXPORT int execv(const char *p, char *const argv[]) {
    before_exec();
    int r = get_execv()(p, argv);
    exec_failed();
    return r;
}

EXPORT int execvp(const char *p, char *const argv[]) {
    before_exec();
    int r = get_execvp()(p, argv);
    exec_failed();
    return r;
}

EXPORT int execvpe(const char *p, char *const argv[], char *const envp[]) {
    before_exec();
    int r = get_execvpe()(p, argv, envp);
    exec_failed();
    return r;
}
