// nfdelay: holds every packet of an NFQUEUE queue for a fixed time, then accepts it.
// netem is not in this kernel; this gives a network link a latency (per direction, on the
// receiving side: iptables -t mangle -A PREROUTING -i DEV -j NFQUEUE --queue-num Q --queue-bypass).
//
//   nfdelay QUEUE DELAY_US
//
// Packets leave in the order they came (the delay is the same for all), so a FIFO of packet
// ids with their due times is all the state. Only metadata is copied to user space
// (NFQNL_COPY_META) and GSO packets are taken whole, so the cost is one small message per
// (super)packet. Built by netpfs.sh: gcc -O2 -o nfdelay nfdelay.c -lnetfilter_queue -lnfnetlink
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <linux/netlink.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define CAP (1 << 20)
static uint32_t ids[CAP];
static uint64_t due[CAP];
static size_t head, tail; // ring: [head, tail)
static uint64_t delay_ns;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *m, struct nfq_data *nfa, void *d) {
    (void)m;
    (void)d;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (tail - head >= CAP) return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL); // full: no delay
    ids[tail % CAP] = id;
    due[tail % CAP] = now_ns() + delay_ns;
    tail++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: nfdelay QUEUE DELAY_US\n");
        return 2;
    }
    int queue = atoi(argv[1]);
    delay_ns = strtoull(argv[2], NULL, 10) * 1000ull;
    struct nfq_handle *h = nfq_open();
    if (!h) { perror("nfdelay: nfq_open"); return 1; }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)queue, &on_packet, NULL);
    if (!qh) { perror("nfdelay: nfq_create_queue (is another nfdelay on this queue?)"); return 1; }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) { perror("nfdelay: nfq_set_mode"); return 1; }
    nfq_set_queue_maxlen(qh, 65536);
    nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
    nfnl_rcvbufsiz(nfq_nfnlh(h), 16 << 20);
    int fd = nfq_fd(h), one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    char buf[65536] __attribute__((aligned));
    for (;;) {
        struct timespec wait = {0, 0}, *timeout = NULL; // none: sleep until a packet comes
        if (head != tail) {
            uint64_t n = now_ns(), d = due[head % CAP], left = d > n ? d - n : 0;
            wait.tv_sec = (time_t)(left / 1000000000ull);
            wait.tv_nsec = (long)(left % 1000000000ull);
            timeout = &wait;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = ppoll(&p, 1, timeout, NULL);
        if (r < 0 && errno != EINTR) { perror("nfdelay: poll"); return 1; }
        if (r > 0) {
            for (;;) {
                ssize_t len = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                if (len < 0) break;
                nfq_handle_packet(h, buf, (int)len);
            }
        }
        uint64_t n = now_ns();
        while (head != tail && due[head % CAP] <= n) {
            nfq_set_verdict(qh, ids[head % CAP], NF_ACCEPT, 0, NULL);
            head++;
        }
    }
}
