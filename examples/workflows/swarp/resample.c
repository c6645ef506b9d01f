/*
 * A SWarp-like workflow stage (Daley et al. §3.1.2): the "resample" step of SWarp, which reads
 * raw sky images and their weight maps (FITS files of tens of MiB), interpolates them onto a
 * common grid with several threads working on regions of the same image, and writes one
 * resampled image and weight map per input. I/O is a few large sequential transfers, so the
 * stage is bandwidth-bound, as Daley found SWarp to be.
 *
 *   resample prepare DIR [IMAGES] [MIB]   writes IMAGES images of MIB MiB (and weights of half
 *                                         that) into DIR/in (default 4 x 32 MiB): the stage-in
 *   resample run DIR [THREADS]            resamples the images in DIR/in into DIR/out (default 4 threads)
 *
 * Images are read with read() and weights with fread() (libc buffering, Daley §3.3), both in
 * 4 MiB transfers; outputs are written with write() in 4 MiB transfers.
 * Build: cc -O2 -pthread -o resample resample.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FITS_BLOCK 2880
#define CHUNK (4u << 20)

static void die(const char *what, const char *path) {
    fprintf(stderr, "resample: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

/* A minimal FITS primary header: 2880 bytes of 80-column cards. */
static void fits_header(char *h, long nx, long ny) {
    char card[81];
    memset(h, ' ', FITS_BLOCK);
    const char *fmt[] = {"SIMPLE  =                    T", "BITPIX  =                  -32",
                         "NAXIS   =                    2"};
    for (int i = 0; i < 3; i++)
        memcpy(h + 80 * i, fmt[i], strlen(fmt[i]));
    snprintf(card, sizeof card, "NAXIS1  = %20ld", nx);
    memcpy(h + 240, card, strlen(card));
    snprintf(card, sizeof card, "NAXIS2  = %20ld", ny);
    memcpy(h + 320, card, strlen(card));
    memcpy(h + 400, "END", 3);
}

static void write_all(int fd, const char *buf, size_t n, const char *path) {
    while (n > 0) {
        size_t part = n < CHUNK ? n : CHUNK;
        ssize_t w = write(fd, buf, part);
        if (w < 0)
            die("cannot write", path);
        buf += w;
        n -= (size_t)w;
    }
}

static void write_fits(const char *path, const float *pix, long nx, long ny) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die("cannot create", path);
    char h[FITS_BLOCK];
    fits_header(h, nx, ny);
    write_all(fd, h, FITS_BLOCK, path);
    write_all(fd, (const char *)pix, (size_t)nx * ny * sizeof(float), path);
    if (close(fd) != 0)
        die("cannot close", path);
}

static int prepare(const char *dir, int images, long mib) {
    char path[4096];
    snprintf(path, sizeof path, "%s/in", dir);
    mkdir(dir, 0755);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        die("cannot create", path);
    long nx = 2048, ny = mib * 1024 * 1024 / (long)sizeof(float) / nx;
    float *pix = malloc((size_t)nx * ny * sizeof(float));
    if (!pix)
        die("out of memory for", dir);
    for (int i = 0; i < images; i++) {
        unsigned s = 12345u + (unsigned)i;
        for (long k = 0; k < nx * ny; k++) {
            s = s * 1103515245u + 12345u;
            pix[k] = (float)(s >> 16) / 65536.0f;
        }
        snprintf(path, sizeof path, "%s/in/image%02d.fits", dir, i);
        write_fits(path, pix, nx, ny);
        for (long k = 0; k < nx * ny / 2; k++)
            pix[k] = 1.0f;
        snprintf(path, sizeof path, "%s/in/image%02d.weight.fits", dir, i);
        write_fits(path, pix, nx, ny / 2);
    }
    free(pix);
    return 0;
}

struct job {
    const float *in;
    float *out;
    long nx, ny, y0, y1;
};

/* Bilinear interpolation at a sub-pixel shift, one horizontal band per thread. */
static void *resample_band(void *arg) {
    struct job *j = arg;
    const float dx = 0.37f, dy = 0.61f;
    for (long y = j->y0; y < j->y1; y++) {
        long y2 = y + 1 < j->ny ? y + 1 : y;
        for (long x = 0; x < j->nx; x++) {
            long x2 = x + 1 < j->nx ? x + 1 : x;
            float a = j->in[y * j->nx + x], b = j->in[y * j->nx + x2];
            float c = j->in[y2 * j->nx + x], d = j->in[y2 * j->nx + x2];
            j->out[y * j->nx + x] = (1 - dy) * ((1 - dx) * a + dx * b) + dy * ((1 - dx) * c + dx * d);
        }
    }
    return NULL;
}

static float *read_fits(const char *path, long *nx, long *ny, int use_stdio) {
    struct stat st;
    if (stat(path, &st) != 0)
        die("cannot stat", path);
    size_t bytes = (size_t)st.st_size - FITS_BLOCK;
    char h[FITS_BLOCK];
    float *pix = malloc(bytes);
    if (!pix)
        die("out of memory for", path);
    size_t got = 0;
    if (use_stdio) {
        FILE *f = fopen(path, "rb");
        if (!f || fread(h, 1, FITS_BLOCK, f) != FITS_BLOCK)
            die("cannot read", path);
        while (got < bytes) {
            size_t want = bytes - got < CHUNK ? bytes - got : CHUNK;
            size_t r = fread((char *)pix + got, 1, want, f);
            if (r == 0)
                die("short read of", path);
            got += r;
        }
        fclose(f);
    } else {
        int fd = open(path, O_RDONLY);
        if (fd < 0 || read(fd, h, FITS_BLOCK) != FITS_BLOCK)
            die("cannot read", path);
        while (got < bytes) {
            size_t want = bytes - got < CHUNK ? bytes - got : CHUNK;
            ssize_t r = read(fd, (char *)pix + got, want);
            if (r <= 0)
                die("short read of", path);
            got += (size_t)r;
        }
        close(fd);
    }
    *nx = atol(h + 240 + 10);
    *ny = atol(h + 320 + 10);
    if (*nx <= 0 || *ny <= 0 || (size_t)(*nx * *ny) * sizeof(float) != bytes) {
        errno = EINVAL;
        die("bad FITS header in", path);
    }
    return pix;
}

static void resample_file(const char *in_path, const char *out_path, int threads, int use_stdio) {
    long nx, ny;
    float *in = read_fits(in_path, &nx, &ny, use_stdio);
    float *out = malloc((size_t)nx * ny * sizeof(float));
    if (!out)
        die("out of memory for", out_path);
    pthread_t tid[64];
    struct job jobs[64];
    for (int t = 0; t < threads; t++) {
        jobs[t] = (struct job){in, out, nx, ny, ny * t / threads, ny * (t + 1) / threads};
        if (pthread_create(&tid[t], NULL, resample_band, &jobs[t]) != 0)
            die("cannot start a thread for", in_path);
    }
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    write_fits(out_path, out, nx, ny);
    free(in);
    free(out);
}

static int run(const char *dir, int threads) {
    char in[4096], out[4096];
    snprintf(out, sizeof out, "%s/out", dir);
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        die("cannot create", out);
    for (int i = 0;; i++) {
        snprintf(in, sizeof in, "%s/in/image%02d.fits", dir, i);
        if (access(in, R_OK) != 0)
            break;
        snprintf(out, sizeof out, "%s/out/image%02d.resamp.fits", dir, i);
        resample_file(in, out, threads, 0);
        snprintf(in, sizeof in, "%s/in/image%02d.weight.fits", dir, i);
        snprintf(out, sizeof out, "%s/out/image%02d.resamp.weight.fits", dir, i);
        resample_file(in, out, threads, 1);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "prepare") == 0)
        return prepare(argv[2], argc > 3 ? atoi(argv[3]) : 4, argc > 4 ? atol(argv[4]) : 32);
    if (argc >= 3 && strcmp(argv[1], "run") == 0) {
        int threads = argc > 3 ? atoi(argv[3]) : 4;
        return run(argv[2], threads < 1 ? 1 : threads > 64 ? 64 : threads);
    }
    fprintf(stderr, "usage: resample prepare DIR [IMAGES] [MIB] | resample run DIR [THREADS]\n");
    return 2;
}
