/* Device handles: open and close, and the requests on a handle that answer
 * with one number (configuration, interfaces, halt, reset, kernel driver).
 * Part of the libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

EXPORT int libusb_open(libusb_device *d, libusb_device_handle **out)
{
    libusb_context *ctx = d ? d->ctx : NULL;
    if (!ctx || !out)
        return LIBUSB_ERROR_NO_DEVICE;
    int r = simple_call(ctx, "libusb_open", OP_OPEN, NONE, d->key, 0, call_limit(0));
    if (r <= 0)
        return r < 0 ? r : LIBUSB_ERROR_IO;
    libusb_device_handle *h = calloc(1, sizeof *h);
    if (!h)
        return LIBUSB_ERROR_NO_MEM;
    h->ctx = ctx;
    h->dev = libusb_ref_device(d);
    h->key = r;
    *out = h;
    return 0;
}

EXPORT libusb_device_handle *libusb_open_device_with_vid_pid(libusb_context *ctx,
                                                             uint16_t vid, uint16_t pid)
{
    libusb_device **list;
    libusb_device_handle *h = NULL;
    if (libusb_get_device_list(ctx, &list) < 0)
        return NULL;
    for (libusb_device **p = list; *p; p++) {
        struct libusb_device_descriptor desc;
        libusb_get_device_descriptor(*p, &desc);
        if (desc.idVendor == vid && desc.idProduct == pid) {
            if (libusb_open(*p, &h) != 0)
                h = NULL;
            break;
        }
    }
    libusb_free_device_list(list, 1);
    return h;
}

EXPORT void libusb_close(libusb_device_handle *h)
{
    if (!h)
        return;
    libusb_context *ctx = h->ctx;
    simple_call(ctx, "libusb_close", OP_CLOSE, h->key, 0, 0, call_limit(0));
    /* Wake the threads waiting in libusb_handle_events (as closing does in libusb). */
    pthread_mutex_lock(&ctx->lock);
    ctx->wake_seq++;
    pthread_cond_broadcast(&ctx->events_cond);
    pthread_mutex_unlock(&ctx->lock);
    libusb_unref_device(h->dev);
    free(h);
}

EXPORT libusb_device *libusb_get_device(libusb_device_handle *h) { return h->dev; }

/* ---- requests on a handle ------------------------------------------------------- */

/* A request on an open handle that answers with one number (>= 0, or a libusb error). */
static int handle_call(libusb_device_handle *h, const char *name, int op, int64_t a1,
                       int64_t a2)
{
    return simple_call(h->ctx, name, op, h->key, a1, a2, call_limit(0));
}

EXPORT int libusb_set_configuration(libusb_device_handle *h, int value)
{
    return handle_call(h, "libusb_set_configuration", OP_SET_CONFIGURATION, value, 0);
}

EXPORT int libusb_get_configuration(libusb_device_handle *h, int *value)
{
    int r = handle_call(h, "libusb_get_configuration", OP_GET_CONFIGURATION, 0, 0);
    if (r < 0)
        return r;
    *value = r;
    return 0;
}

EXPORT int libusb_claim_interface(libusb_device_handle *h, int number)
{
    return handle_call(h, "libusb_claim_interface", OP_CLAIM, number, 0);
}

EXPORT int libusb_release_interface(libusb_device_handle *h, int number)
{
    return handle_call(h, "libusb_release_interface", OP_RELEASE, number, 0);
}

EXPORT int libusb_set_interface_alt_setting(libusb_device_handle *h, int number, int alt)
{
    return handle_call(h, "libusb_set_interface_alt_setting", OP_SET_ALT, number, alt);
}

EXPORT int libusb_clear_halt(libusb_device_handle *h, unsigned char endpoint)
{
    return handle_call(h, "libusb_clear_halt", OP_CLEAR_HALT, endpoint, 0);
}

EXPORT int libusb_reset_device(libusb_device_handle *h)
{
    return handle_call(h, "libusb_reset_device", OP_RESET, 0, 0);
}

EXPORT int libusb_kernel_driver_active(libusb_device_handle *h, int number)
{
    return handle_call(h, "libusb_kernel_driver_active", OP_KERNEL_DRIVER_ACTIVE, number, 0);
}

EXPORT int libusb_detach_kernel_driver(libusb_device_handle *h, int number)
{
    return handle_call(h, "libusb_detach_kernel_driver", OP_DETACH_KERNEL_DRIVER, number, 0);
}

EXPORT int libusb_attach_kernel_driver(libusb_device_handle *h, int number)
{
    return handle_call(h, "libusb_attach_kernel_driver", OP_ATTACH_KERNEL_DRIVER, number, 0);
}

EXPORT int libusb_set_auto_detach_kernel_driver(libusb_device_handle *h, int enable)
{
    (void)h;
    (void)enable;
    return LIBUSB_SUCCESS;
}
