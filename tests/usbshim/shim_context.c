/* The library and its contexts: libusb_init and libusb_exit (one connection
 * per context; the default context is reference-counted), options,
 * capabilities and the version.  Part of the libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

#include <sys/socket.h>
#include <unistd.h>

static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static libusb_context *default_ctx;
static int default_refs;

libusb_context *ctx_or_default(libusb_context *ctx)
{
    if (ctx)
        return ctx;
    pthread_mutex_lock(&default_lock);
    ctx = default_ctx;
    pthread_mutex_unlock(&default_lock);
    return ctx;
}

/* A context that will not be used: close its connection and free it. */
static void discard(libusb_context *ctx)
{
    if (ctx->fd >= 0)
        shutdown(ctx->fd, SHUT_RDWR);
    if (ctx->reader_started)
        pthread_join(ctx->reader, NULL);
    if (ctx->fd >= 0)
        close(ctx->fd);
    free(ctx);
}

EXPORT int libusb_init(libusb_context **out)
{
    settings();
    if (!out) {
        pthread_mutex_lock(&default_lock);
        if (default_ctx) {
            default_refs++;
            pthread_mutex_unlock(&default_lock);
            return 0;
        }
        pthread_mutex_unlock(&default_lock);
    }
    libusb_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return LIBUSB_ERROR_NO_MEM;
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->write_lock, NULL);
    cond_init(&ctx->calls_cond);
    cond_init(&ctx->events_cond);
    ctx->fd = -1;
    int r = connect_server(ctx);
    if (r == 0 && pthread_create(&ctx->reader, NULL, reader_main, ctx) != 0)
        r = LIBUSB_ERROR_NO_MEM;
    if (r == 0) {
        ctx->reader_started = 1;
        int64_t args[8] = {getpid()};
        struct call c = {0};
        double limit = max_wait < 10 ? max_wait : 10;
        r = ask(ctx, &c, 0, KIND_REPLY, OP_HELLO, args, NULL, 0, limit);
        free(c.payload);
        if (r == 1)
            shim_warn("libusb_init", "the server did not answer within %.1f s", limit);
        if (r != 0)
            r = LIBUSB_ERROR_IO;
    }
    const char *where = getenv("CORALRT_USBSHIM_SOCKET");
    shim_log("libusb_init", NONE, NONE, NONE, NONE, NONE, error_name(r), "socket %s",
             where ? where : "(CORALRT_USBSHIM_SOCKET not set)");
    if (r != 0) {
        discard(ctx);
        return r;
    }
    if (out) {
        *out = ctx;
    } else {
        pthread_mutex_lock(&default_lock);
        if (default_ctx) {            /* another thread won the race */
            default_refs++;
            pthread_mutex_unlock(&default_lock);
            discard(ctx);
            return 0;
        }
        default_ctx = ctx;
        default_refs = 1;
        pthread_mutex_unlock(&default_lock);
    }
    return 0;
}

EXPORT void libusb_exit(libusb_context *ctx)
{
    if (!ctx) {
        pthread_mutex_lock(&default_lock);
        if (!default_ctx || --default_refs > 0) {
            pthread_mutex_unlock(&default_lock);
            return;
        }
        ctx = default_ctx;
        default_ctx = NULL;
        pthread_mutex_unlock(&default_lock);
    }
    shim_log("libusb_exit", NONE, NONE, NONE, NONE, NONE, "LIBUSB_SUCCESS", NULL);
    pthread_mutex_lock(&ctx->lock);
    ctx->closing = 1;
    pthread_mutex_unlock(&ctx->lock);
    pthread_mutex_lock(&ctx->write_lock);
    shutdown(ctx->fd, SHUT_RDWR);
    pthread_mutex_unlock(&ctx->write_lock);
    if (ctx->reader_started)
        pthread_join(ctx->reader, NULL);
    pthread_mutex_lock(&ctx->write_lock);
    close(ctx->fd);
    ctx->fd = -1;
    pthread_mutex_unlock(&ctx->write_lock);
    /* Devices still referenced outlive the context; they only lose it. */
    pthread_mutex_lock(&dev_lock);
    for (libusb_device *d = ctx->devices; d; d = d->next)
        d->ctx = NULL;
    ctx->devices = NULL;
    pthread_mutex_unlock(&dev_lock);
    /* The context's memory is not freed: a late callback or device may still
     * point at it.  A test process creates few contexts. */
}

EXPORT void libusb_set_debug(libusb_context *ctx, int level) { (void)ctx; (void)level; }

EXPORT int libusb_set_option(libusb_context *ctx, int option, ...)
{
    (void)ctx;
    (void)option;
    return LIBUSB_SUCCESS;
}

EXPORT int libusb_has_capability(uint32_t capability)
{
    return capability == LIBUSB_CAP_HAS_CAPABILITY;
}

EXPORT const struct libusb_version *libusb_get_version(void)
{
    static const struct libusb_version v = {1, 0, 26, 0, "", "coralrt usbshim"};
    return &v;
}
