/* Devices: the device list the server sends, references, bus and port numbers.
 * Part of the libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;

static void device_free(libusb_device *d)
{
    for (int i = 0; i < d->nconfigs; i++)
        free(d->configs[i]);
    free(d);
}

EXPORT libusb_device *libusb_ref_device(libusb_device *d)
{
    pthread_mutex_lock(&dev_lock);
    d->refs++;
    pthread_mutex_unlock(&dev_lock);
    return d;
}

EXPORT void libusb_unref_device(libusb_device *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&dev_lock);
    int gone = --d->refs <= 0;
    if (gone && d->ctx) {
        for (libusb_device **p = &d->ctx->devices; *p; p = &(*p)->next) {
            if (*p == d) {
                *p = d->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&dev_lock);
    if (gone)
        device_free(d);
}

/* Parse one device record of a DEVICE_LIST answer; returns bytes used or -1. */
static long parse_device(libusb_context *ctx, const unsigned char *p, size_t left,
                         libusb_device **out)
{
    const size_t fixed = 8 + 4 + 7 + 18 + 1;
    if (left < fixed)
        return -1;
    int64_t key = get_i64(p);
    size_t used = fixed;
    int nconfigs = p[37];
    libusb_device tmp;
    memset(&tmp, 0, sizeof tmp);
    for (int i = 0; i < nconfigs; i++) {
        if (left < used + 2)
            return -1;
        uint16_t n = get_u16(p + used);
        used += 2;
        if (left < used + n)
            return -1;
        if (i < 8) {
            tmp.configs[i] = malloc(n ? n : 1);
            if (tmp.configs[i])
                memcpy(tmp.configs[i], p + used, n);
            tmp.config_len[i] = n;
            tmp.nconfigs = i + 1;
        }
        used += n;
    }
    pthread_mutex_lock(&dev_lock);
    libusb_device *d;
    for (d = ctx->devices; d; d = d->next)
        if (d->key == key)
            break;
    if (d) {
        d->refs++;
        pthread_mutex_unlock(&dev_lock);
        for (int i = 0; i < tmp.nconfigs; i++)
            free(tmp.configs[i]);
    } else {
        d = calloc(1, sizeof *d);
        if (!d) {
            pthread_mutex_unlock(&dev_lock);
            return -1;
        }
        *d = tmp;
        d->ctx = ctx;
        d->refs = 1;
        d->key = key;
        d->bus = p[8];
        d->address = p[9];
        d->speed = p[10];
        d->nports = p[11] > 7 ? 7 : p[11];
        memcpy(d->ports, p + 12, 7);
        memcpy(d->descriptor, p + 19, 18);
        d->next = ctx->devices;
        ctx->devices = d;
        pthread_mutex_unlock(&dev_lock);
    }
    *out = d;
    return (long)used;
}

EXPORT ssize_t libusb_get_device_list(libusb_context *ctx, libusb_device ***list)
{
    ctx = ctx_or_default(ctx);
    if (!ctx || !list)
        return LIBUSB_ERROR_INVALID_PARAM;
    struct call c = {0};
    double limit = call_limit(0);
    int r = ask(ctx, &c, 0, KIND_REPLY, OP_DEVICE_LIST, NULL, NULL, 0, limit);
    if (r == 1) {
        shim_warn("libusb_get_device_list", "no answer from the server within %.1f s", limit);
        r = LIBUSB_ERROR_IO;
    } else if (r == 0 && c.result < 0) {
        r = c.result;
    }
    if (r != 0) {
        free(c.payload);
        shim_log("libusb_get_device_list", (long long)c.id, NONE, NONE, NONE, NONE,
                 error_name(r), NULL);
        return r;
    }
    int n = c.result;
    libusb_device **devs = calloc((size_t)n + 1, sizeof *devs);
    if (!devs) {
        free(c.payload);
        return LIBUSB_ERROR_NO_MEM;
    }
    size_t off = 0;
    int got = 0;
    for (int i = 0; i < n; i++) {
        long used = parse_device(ctx, c.payload + off, c.payload_len - off, &devs[got]);
        if (used < 0)
            break;
        off += (size_t)used;
        got++;
    }
    free(c.payload);
    *list = devs;
    shim_log("libusb_get_device_list", (long long)c.id, NONE, NONE, NONE, got,
             "LIBUSB_SUCCESS", "%d device(s)", got);
    return got;
}

EXPORT void libusb_free_device_list(libusb_device **list, int unref)
{
    if (!list)
        return;
    if (unref)
        for (libusb_device **p = list; *p; p++)
            libusb_unref_device(*p);
    free(list);
}

EXPORT uint8_t libusb_get_bus_number(libusb_device *d) { return d->bus; }
EXPORT uint8_t libusb_get_device_address(libusb_device *d) { return d->address; }
EXPORT int libusb_get_device_speed(libusb_device *d) { return d->speed; }
EXPORT uint8_t libusb_get_port_number(libusb_device *d)
{
    return d->nports ? d->ports[d->nports - 1] : 0;
}

EXPORT int libusb_get_port_numbers(libusb_device *d, uint8_t *ports, int len)
{
    if (len < d->nports)
        return LIBUSB_ERROR_OVERFLOW;
    memcpy(ports, d->ports, d->nports);
    return d->nports;
}

EXPORT int libusb_get_port_path(libusb_context *ctx, libusb_device *d, uint8_t *ports, uint8_t len)
{
    (void)ctx;
    return libusb_get_port_numbers(d, ports, len);
}

EXPORT libusb_device *libusb_get_parent(libusb_device *d)
{
    (void)d;
    return NULL;   /* the simulated hub is not listed */
}
