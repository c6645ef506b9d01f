/* ROMIO data sieving from several nodes (issue 32): each rank writes every size-th block of
 * one shared file through a strided file view with independent MPI_File_write_at calls and
 * romio_ds_write=enable, so ROMIO writes by read-modify-write of the whole extent under an
 * fcntl lock. Rank r opens argv[1 + r] (the same file through its own node's mount). After
 * the rounds rank 0 reads the file and counts the blocks that do not hold their rank's last
 * round: an update lost to another node's read-modify-write (locks not coordinated, or a
 * stale cached read under the lock) shows as a wrong block. Prints "blocks N wrong W". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 4096
#define N 64
#define ROUNDS 30

static unsigned char mark(int rank, int round, int i) {
    return (unsigned char)(1 + rank * 61 + round * 7 + i);
}

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 1 + size) {
        if (rank == 0) fprintf(stderr, "usage: romio_sieve PATH-OF-RANK-0 PATH-OF-RANK-1 ...\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *path = argv[1 + rank];
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "romio_ds_write", "enable");
    MPI_Info_set(info, "romio_ds_read", "enable");
    MPI_Info_set(info, "romio_cb_write", "disable");
    MPI_File fh;
    int rc = MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, info, &fh);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "rank %d: open %s: %s\n", rank, path, msg);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Datatype vec;
    MPI_Type_vector(N, B, B * size, MPI_BYTE, &vec);
    MPI_Type_commit(&vec);
    MPI_File_set_view(fh, (MPI_Offset)rank * B, MPI_BYTE, vec, "native", info);
    static unsigned char buf[N * B];
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) memset(buf + (size_t)i * B, mark(rank, round, i), B);
        MPI_Status st;
        rc = MPI_File_write_at(fh, 0, buf, N * B, MPI_BYTE, &st);
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "rank %d: write round %d failed\n", rank, round);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_File_sync(fh);
    MPI_File_close(&fh);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            perror(path);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        static unsigned char blk[B];
        int wrong = 0, blocks = 0;
        for (int b = 0; b < N * size; b++) {
            if (fread(blk, 1, B, f) != B) {
                wrong += N * size - b;
                break;
            }
            blocks++;
            int owner = b % size, i = b / size;
            unsigned char want = mark(owner, ROUNDS - 1, i);
            for (int k = 0; k < B; k++) {
                if (blk[k] != want) {
                    if (wrong < 5)
                        fprintf(stderr, "block %d (rank %d's %d): byte %d is %d, not %d\n", b,
                                owner, i, k, blk[k], want);
                    wrong++;
                    break;
                }
            }
        }
        fclose(f);
        printf("blocks %d wrong %d\n", blocks, wrong);
        fflush(stdout);
        MPI_Finalize();
        return wrong ? 1 : 0;
    }
    MPI_Finalize();
    return 0;
}
