/*
 * datawarp.h — Surge's libdatawarp: the staging API of Cray DataWarp, for programs written
 * for it. Same function names, argument lists, return conventions and enum values as Cray's
 * documented API, so such a program compiles and links unchanged (cc ... -ldatawarp).
 *
 * Written for Surge (Apache-2.0); see docs/LIBDATAWARP.md for what each call does on Surge
 * and where it differs from DataWarp.
 *
 * Where it works: inside a job started by `surge run` (which sets $SURGE_RUN_DIR). Paths named
 * "dw_..." lie under the job's burst-buffer mounts ($DW_JOB_STRIPED, $DW_JOB_PRIVATE,
 * $DW_PERSISTENT_STRIPED_<name>); paths named "pfs_..." are anywhere else.
 *
 * Returns: 0 on success, or a negative errno (-ENOENT, -EINVAL, ...) on failure, unless a
 * function says otherwise. surge_dw_last_error() tells the reason in words.
 */
#ifndef SURGE_DATAWARP_H
#define SURGE_DATAWARP_H

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* When a stage-out runs, or what to do with one asked for earlier. */
enum dw_stage_type {
    DW_STAGE_IMMEDIATE = 0,          /* copy now, in the background */
    DW_STAGE_AT_JOB_END = 1,         /* copy when the job's script has exited */
    DW_REVOKE_STAGE_AT_JOB_END = 2,  /* forget an earlier DW_STAGE_AT_JOB_END of this path */
    DW_ACTIVATE_DEFERRED_STAGE = 3   /* run an earlier DW_STAGE_AT_JOB_END of this path now */
};

/* Opaque: the walk over failed stages (dw_open_failed_stage). */
typedef struct dw_failed_stage_state dw_failed_stage_t;

/* --- Starting stages (asynchronous: they return once the copy is started) --- */

/* Copy one PFS file to dw_file_path (created, or replaced once complete). */
int dw_stage_file_in(const char *dw_file_path, const char *pfs_file_path);

/* Copy the contents of a PFS directory, recursively, into dw_directory_path. */
int dw_stage_directory_in(const char *dw_directory_path, const char *pfs_directory_path);

/* Copy each file of a NULL-terminated list into dw_directory_path (same base names). */
int dw_stage_list_in(const char *dw_directory_path, const char **pfs_file_paths);

/* Copy one file of the burst buffer to the PFS, now or at job end (see enum dw_stage_type). */
int dw_stage_file_out(const char *dw_file_path, const char *pfs_file_path,
                      enum dw_stage_type stage_type);

/* Copy the contents of a burst-buffer directory, recursively, into pfs_directory_path. */
int dw_stage_directory_out(const char *dw_directory_path, const char *pfs_directory_path,
                           enum dw_stage_type stage_type);

/* Copy each file of a NULL-terminated list into pfs_directory_path (same base names). */
int dw_stage_list_out(const char **dw_file_paths, const char *pfs_directory_path,
                      enum dw_stage_type stage_type);

/* --- Following stages --- */

/*
 * How many stage operations naming the path are complete, pending (queued or copying),
 * deferred (to job end) and failed. Any of the counters may be NULL. For a file, the latest
 * stage of that file; for a directory, every stage inside it. -EINVAL: no stage names it.
 */
int dw_query_file_stage(const char *dw_file_path, int *complete, int *pending,
                        int *deferred, int *failed);
int dw_query_directory_stage(const char *dw_directory_path, int *complete, int *pending,
                             int *deferred, int *failed);
int dw_query_list_stage(const char **dw_file_paths, int *complete, int *pending,
                        int *deferred, int *failed);

/*
 * Block until the stages naming the path have ended (deferred ones are not waited for: they
 * run at job end). 0 when they all completed; the negative errno of a failure otherwise.
 */
int dw_wait_file_stage(const char *dw_file_path);
int dw_wait_directory_stage(const char *dw_directory_path);
int dw_wait_list_stage(const char **dw_file_paths);

/* Stop the pending or deferred stages naming the path (files not finished are removed). */
int dw_terminate_file_stage(const char *dw_file_path);
int dw_terminate_directory_stage(const char *dw_directory_path);
int dw_terminate_list_stage(const char **dw_file_paths);

/* Files in flight for the later stages of the instance holding dw_instance_path (1..256). */
int dw_set_stage_concurrency(const char *dw_instance_path, unsigned int concurrent_stages);

/*
 * Walk the files whose stage failed, under dw_instance_path:
 *   dw_open_failed_stage: 0 and a handle, or -errno.
 *   dw_read_failed_stage: > 0, the length (strlen) of the burst-buffer path written,
 *     NUL-terminated, to `path`, and *ret_errno = -errno of the failure; 0 at the end of the
 *     walk; -ENAMETOOLONG if path_size is too small (the entry is kept for the next call).
 *   dw_close_failed_stage: 0, or -EINVAL for a NULL handle.
 */
int dw_open_failed_stage(const char *dw_instance_path, dw_failed_stage_t **handle);
int dw_read_failed_stage(dw_failed_stage_t *handle, char *path, int path_size, int *ret_errno);
int dw_close_failed_stage(dw_failed_stage_t *handle);

/* --- Layout --- */

/*
 * The stripe size (bytes), stripe width (fragments) and index of the fragment holding offset 0
 * of a file open on a burst-buffer mount (a directory gets index 0).
 */
int dw_get_stripe_configuration(int fd, int *stripe_size, int *stripe_width,
                                int *starting_index);

/*
 * Surge stripes every file of an instance alike: this succeeds when the configuration asked
 * for is the file's already, and fails with -EOPNOTSUPP otherwise (-EINVAL for a zero width or
 * a size that is not a multiple of 4096).
 */
int dw_set_stripe_configuration(int fd, int stripe_size, int stripe_width);

/*
 * The path prefix to use for files of `key` on the metadata server chosen for it, under the
 * root of a striped mount (e.g. $DW_JOB_STRIPED). Surge gives a namespace one metadata server,
 * so this is dw_root itself. Allocated with malloc: free() it. NULL if dw_root is not the root
 * of a burst-buffer mount of the job.
 */
char *dw_get_mds_path(const char *dw_root, uint64_t key);

/* --- Surge's addition --- */

/*
 * Why the last failing call of this thread failed, in words (empty if none failed). The
 * string belongs to the library and stays valid until the thread's next dw_* call. Set
 * SURGE_DW_VERBOSE=1 to have every failure also printed on stderr.
 */
const char *surge_dw_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SURGE_DATAWARP_H */
