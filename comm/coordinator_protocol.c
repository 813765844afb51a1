/* The coordinator's line-JSON framing, shared by its two sides (coordinator_server.c and
 * coordinator_client.c): growable byte buffers cut at newlines, a message as one line, the
 * fields of a received message, and the little socket and clock helpers both need. */
#include "comm/coordinator_protocol.h"

#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* ---- byte buffers and lines ---------------------------------------------- */

bool pt_coord_buffer_append(pt_coord_buffer *b, const void *data, size_t n)
{
    if (b->length + n > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->length + n) capacity *= 2;
        char *grown = realloc(b->data, capacity);
        if (!grown) return false;
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->length, data, n);
    b->length += n;
    return true;
}

void pt_coord_buffer_consume(pt_coord_buffer *b, size_t n)
{
    memmove(b->data, b->data + n, b->length - n);
    b->length -= n;
}

/* The first '\n' in b, or NULL. */
char *pt_coord_find_newline(const pt_coord_buffer *b)
{
    return b->length ? memchr(b->data, '\n', b->length) : NULL;
}

void pt_coord_buffer_free(pt_coord_buffer *b)
{
    free(b->data);
    *b = (pt_coord_buffer){0};
}

/* The JSON text of `message` plus '\n' (consumes the reference); NULL if out
 * of memory. */
char *pt_coord_message_text(json_t *message, size_t *length)
{
    char *text = message ? json_dumps(message, JSON_COMPACT) : NULL;
    json_decref(message);
    if (!text) return NULL;
    *length = strlen(text);
    char *line = realloc(text, *length + 2);
    if (!line) {
        free(text);
        return NULL;
    }
    line[(*length)++] = '\n';
    line[*length] = '\0';
    return line;
}

/* Fields of a received message. */
const char *pt_coord_get_string(json_t *m, const char *key)
{
    return json_string_value(json_object_get(m, key));
}

bool pt_coord_get_long(json_t *m, const char *key, long *value)
{
    json_t *v = json_object_get(m, key);
    if (!json_is_integer(v)) return false;
    *value = (long)json_integer_value(v);
    return true;
}

double pt_coord_get_double(json_t *m, const char *key, double fallback)
{
    json_t *v = json_object_get(m, key);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

/* ---- sockets and time ---------------------------------------------------- */

void pt_coord_set_no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct timespec pt_coord_deadline_after(double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = floor(seconds);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}
