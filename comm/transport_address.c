/* A transport's address: its UCX worker address (ucp_worker_get_address), an opaque blob
 * that names every device and port the worker can be reached at, written as hexadecimal
 * text so that it travels through the coordinator's JSON and a host program's allgather
 * like any string. Peers connect to it with ucp_ep_create(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS):
 * there is no sockaddr listener (docs/ARCHITECTURE.md, "Connections", says why). */
#include "comm/transport_internal.h"
#include "comm/transport_address.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

static const char hex_digits[] = "0123456789abcdef";

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

pipert_result pt_transport_publish_address(pt_transport *t)
{
    ucp_address_t *address;
    size_t length;
    ucs_status_t status = ucp_worker_get_address(t->worker, &address, &length);
    if (status != UCS_OK) return pt_transport_ucx_fail(status, "ucp_worker_get_address");
    if (length > WORKER_ADDRESS_MAX) {
        ucp_worker_release_address(t->worker, address);
        return pt_fail(PIPERT_ERR_TRANSPORT,
                       "transport: the UCX worker address has %zu bytes, more than the %d a hello "
                       "carries (restrict the devices with UCX_NET_DEVICES)",
                       length, WORKER_ADDRESS_MAX);
    }
    memcpy(t->worker_address, address, length);
    t->worker_address_length = length;
    ucp_worker_release_address(t->worker, address);
    for (size_t i = 0; i < length; i++) {
        t->address_text[2 * i] = hex_digits[t->worker_address[i] >> 4];
        t->address_text[2 * i + 1] = hex_digits[t->worker_address[i] & 15];
    }
    t->address_text[2 * length] = '\0';
    return PIPERT_OK;
}

pipert_result pt_transport_decode_address(const char *text, uint8_t *out, size_t *length)
{
    size_t digits = strlen(text);
    if (digits == 0 || digits % 2 || digits / 2 > WORKER_ADDRESS_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "transport address \"%.40s%s\": expected 2 to %d hexadecimal digits, an "
                       "even number (pt_transport_address of the peer)",
                       text, digits > 40 ? "..." : "", 2 * WORKER_ADDRESS_MAX);
    for (size_t i = 0; i < digits / 2; i++) {
        int high = hex_value(text[2 * i]), low = hex_value(text[2 * i + 1]);
        if (high < 0 || low < 0)
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "transport address \"%.40s%s\": '%c' at %zu is not a hexadecimal digit",
                           text, digits > 40 ? "..." : "", high < 0 ? text[2 * i] : text[2 * i + 1],
                           high < 0 ? 2 * i : 2 * i + 1);
        out[i] = (uint8_t)(high << 4 | low);
    }
    *length = digits / 2;
    return PIPERT_OK;
}
