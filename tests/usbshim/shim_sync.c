/* Synchronous transfers (control, bulk, interrupt) and string descriptors.
 * Part of the libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

/* Ask for a transfer whose data goes one way: an IN transfer's data lands in
 * data (up to length bytes), an OUT transfer's is sent from it.  Returns what
 * ask() returns; c holds the answer. */
static int ask_transfer(libusb_device_handle *h, struct call *c, int want_kind, int op,
                        const int64_t args[8], int in, unsigned char *data, uint32_t length,
                        double limit)
{
    c->in_buf = in ? data : NULL;
    c->in_cap = in ? length : 0;
    int r = ask(h->ctx, c, 0, want_kind, op, args, in ? NULL : data, in ? 0 : length, limit);
    if (!c->in_buf)
        free(c->payload);
    return r;
}

EXPORT int libusb_control_transfer(libusb_device_handle *h, uint8_t request_type,
                                   uint8_t request, uint16_t value, uint16_t index,
                                   unsigned char *data, uint16_t length, unsigned int timeout)
{
    if (!h)
        return LIBUSB_ERROR_INVALID_PARAM;
    int in = request_type & LIBUSB_ENDPOINT_IN;
    int64_t args[8] = {h->key, request_type, request, value, index, length, timeout};
    struct call c = {0};
    double limit = call_limit(timeout);
    int r = ask_transfer(h, &c, KIND_REPLY, OP_CONTROL, args, in, data, length, limit);
    if (r == 1) {
        shim_warn("libusb_control_transfer", "no answer from the server within %.1f s "
                  "(bmRequestType=0x%02x bRequest=%u)", limit, request_type, request);
        r = LIBUSB_ERROR_TIMEOUT;
    } else if (r == 0) {
        r = c.result;
        if (in && r > (int)c.payload_len)
            r = (int)c.payload_len;
    }
    shim_log("libusb_control_transfer", (long long)c.id, h->key, 0, length,
             r >= 0 ? r : 0, error_name(r),
             "bmRequestType=0x%02x bRequest=%u wValue=0x%04x wIndex=0x%04x",
             request_type, request, value, index);
    return r;
}

/* A bulk or interrupt transfer done synchronously: queued at the server behind
 * the transfers already submitted on the endpoint, like any other. */
static int sync_transfer(const char *name, int type, libusb_device_handle *h,
                         unsigned char endpoint, unsigned char *data, int length,
                         int *transferred, unsigned int timeout)
{
    if (transferred)
        *transferred = 0;
    if (!h || length < 0)
        return LIBUSB_ERROR_INVALID_PARAM;
    int in = endpoint & LIBUSB_ENDPOINT_IN;
    int64_t args[8] = {h->key, endpoint, type, length, timeout, 0, 1};
    struct call c = {0};
    double limit = call_limit(timeout);
    int r = ask_transfer(h, &c, KIND_COMPLETION, OP_SUBMIT, args, in, data, (uint32_t)length,
                         limit);
    int actual = 0;
    const char *status;
    if (r == 1) {
        /* Take the transfer back, so that it cannot eat data later. */
        send_cancel(h->ctx, c.id);
        shim_warn(name, "no completion from the server within %.1f s (endpoint 0x%02x)",
                  limit, endpoint);
        r = LIBUSB_ERROR_TIMEOUT;
        status = error_name(r);
    } else if (r == 0) {
        actual = c.actual < 0 ? 0 : (c.actual > length ? length : c.actual);
        if (c.result == LIBUSB_TRANSFER_COMPLETED)
            r = 0;
        else
            r = c.error < 0 ? c.error : status_error(c.result);
        status = status_name(c.result);
    } else {
        status = error_name(r);
    }
    if (transferred)
        *transferred = actual;
    shim_log(name, (long long)c.id, h->key, endpoint, length, actual, status,
             r ? "returns %s" : NULL, error_name(r));
    return r;
}

EXPORT int libusb_bulk_transfer(libusb_device_handle *h, unsigned char endpoint,
                                unsigned char *data, int length, int *transferred,
                                unsigned int timeout)
{
    return sync_transfer("libusb_bulk_transfer", LIBUSB_TRANSFER_TYPE_BULK, h, endpoint,
                         data, length, transferred, timeout);
}

EXPORT int libusb_interrupt_transfer(libusb_device_handle *h, unsigned char endpoint,
                                     unsigned char *data, int length, int *transferred,
                                     unsigned int timeout)
{
    return sync_transfer("libusb_interrupt_transfer", LIBUSB_TRANSFER_TYPE_INTERRUPT, h,
                         endpoint, data, length, transferred, timeout);
}

EXPORT int libusb_get_string_descriptor_ascii(libusb_device_handle *h, uint8_t index,
                                              unsigned char *data, int length)
{
    unsigned char buf[255];
    if (index == 0)
        return LIBUSB_ERROR_INVALID_PARAM;
    int r = libusb_control_transfer(h, LIBUSB_ENDPOINT_IN, LIBUSB_REQUEST_GET_DESCRIPTOR,
                                    LIBUSB_DT_STRING << 8, 0, buf, sizeof buf, 1000);
    if (r < 0)
        return r;
    if (r < 4)
        return LIBUSB_ERROR_IO;
    uint16_t lang = get_u16(buf + 2);
    r = libusb_control_transfer(h, LIBUSB_ENDPOINT_IN, LIBUSB_REQUEST_GET_DESCRIPTOR,
                                (uint16_t)((LIBUSB_DT_STRING << 8) | index), lang, buf,
                                sizeof buf, 1000);
    if (r < 0)
        return r;
    if (r < 2 || buf[1] != LIBUSB_DT_STRING || buf[0] > r)
        return LIBUSB_ERROR_IO;
    int n = 0;
    for (int i = 2; i + 1 < buf[0] && n < length - 1; i += 2)
        data[n++] = (buf[i + 1] || buf[i] & 0x80) ? '?' : buf[i];
    if (length > 0)
        data[n] = 0;
    return n;
}
