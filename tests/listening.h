/* Strangers at a process's listening TCP ports, as a test finds them: from the operating
 * system (/proc/PID/fd's socket inodes against the listening entries of /proc/PID/net/tcp
 * and tcp6), and connects to them. For tests/test_strangers.c and tests/test_transport.c. */
#ifndef PT_TEST_LISTENING_H
#define PT_TEST_LISTENING_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_PORTS 64

typedef struct port {
    int family;
    char host[64]; /* where to connect: the bound address, or loopback for a wildcard */
    int port;
    pid_t pid;
} port;

static inline bool owns_inode(pid_t pid, unsigned long inode)
{
    char fd_dir[64];
    snprintf(fd_dir, sizeof fd_dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(fd_dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        char path[400], link[64];
        snprintf(path, sizeof path, "%s/%s", fd_dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = '\0';
        unsigned long socket_inode;
        found = sscanf(link, "socket:[%lu]", &socket_inode) == 1 && socket_inode == inode;
    }
    closedir(d);
    return found;
}

/* /proc/net/tcp writes an address as the hex of its bytes in memory (32-bit words). */
static inline void parse_hex_address(const char *hex, int family, char *out, size_t capacity)
{
    unsigned char bytes[16] = {0};
    size_t n = family == AF_INET ? 4 : 16;
    for (size_t word = 0; word < n / 4; word++) {
        unsigned int value;
        sscanf(hex + 8 * word, "%8x", &value);
        memcpy(bytes + 4 * word, &value, 4);
    }
    static const unsigned char zeros[16];
    if (!memcmp(bytes, zeros, n)) { /* a wildcard: reach it over loopback */
        snprintf(out, capacity, "%s", family == AF_INET ? "127.0.0.1" : "::1");
        return;
    }
    inet_ntop(family, bytes, out, (socklen_t)capacity);
}

/* Adds pid's listening TCP sockets (state 0A) from /proc/PID/net/tcp or tcp6. */
static inline void add_listening(pid_t pid, int family, port *ports, int *n)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/net/%s", (int)pid, family == AF_INET ? "tcp" : "tcp6");
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f) && *n < MAX_PORTS) {
        char local[64], state[8];
        unsigned long inode;
        if (sscanf(line, " %*d: %63s %*s %7s %*s %*s %*s %*s %*s %lu", local, state, &inode) != 3 ||
            strcmp(state, "0A") != 0 || !owns_inode(pid, inode))
            continue;
        char *colon = strchr(local, ':');
        if (!colon) continue;
        *colon = '\0';
        port *p = &ports[(*n)++];
        *p = (port){.family = family, .port = (int)strtol(colon + 1, NULL, 16), .pid = pid};
        parse_hex_address(local, family, p->host, sizeof p->host);
    }
    fclose(f);
}

/* Appends pid's listening TCP sockets, IPv4 and IPv6, to ports[*n..MAX_PORTS). */
static inline void listening_ports(pid_t pid, port *ports, int *n)
{
    add_listening(pid, AF_INET, ports, n);
    add_listening(pid, AF_INET6, ports, n);
}

/* A connected socket to p within a second, or -1: a listener that went away, or that drops
 * new connections, is no failure. */
static inline int stranger_connect(const port *p)
{
    struct sockaddr_storage address = {0};
    socklen_t length;
    if (p->family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&address;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)p->port);
        inet_pton(AF_INET, p->host, &in->sin_addr);
        length = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&address;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)p->port);
        inet_pton(AF_INET6, p->host, &in6->sin6_addr);
        length = sizeof *in6;
    }
    int fd = socket(p->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&address, length) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int error = 0;
    socklen_t error_length = sizeof error;
    if (poll(&pfd, 1, 1000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_length) ||
        error) {
        close(fd);
        return -1;
    }
    return fd;
}

/* UCX 1.13's TCP transport greets with a 64-bit magic number, then frames
 * active messages as {uint8 id, uint32 length}; id 32 is its connection manager. */
static inline size_t ucx_greeting(unsigned char *out, uint8_t am_id, uint32_t length,
                                   size_t header_bytes)
{
    const uint64_t magic = 0xCAFEBABE12345678ull;
    memcpy(out, &magic, 8);
    unsigned char header[5] = {am_id};
    memcpy(header + 1, &length, 4);
    memcpy(out + 8, header, header_bytes);
    return 8 + header_bytes;
}

#endif
