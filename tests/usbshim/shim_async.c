/* Asynchronous transfers (alloc, submit, cancel, free) and
 * libusb_handle_events*, which runs the callbacks of completed transfers in
 * the calling thread.  Part of the libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

EXPORT struct libusb_transfer *libusb_alloc_transfer(int iso_packets)
{
    if (iso_packets < 0)
        return NULL;
    size_t size = PRIV_SIZE + sizeof(struct libusb_transfer) +
                  (size_t)iso_packets * sizeof(struct libusb_iso_packet_descriptor);
    unsigned char *block = calloc(1, size);
    if (!block)
        return NULL;
    struct libusb_transfer *t = pub_of((struct itransfer *)block);
    t->num_iso_packets = iso_packets;
    return t;
}

EXPORT void libusb_free_transfer(struct libusb_transfer *t)
{
    if (!t)
        return;
    struct itransfer *it = priv_of(t);
    if (it->state != IDLE && it->ctx) {
        /* Freed while in flight (a program error): forget it, so that nothing is
         * written into it later. */
        pthread_mutex_lock(&it->ctx->lock);
        if (!unlink_in_flight(it->ctx, it))
            unlink_done(it->ctx, it);
        pthread_mutex_unlock(&it->ctx->lock);
    }
    if ((t->flags & LIBUSB_TRANSFER_FREE_BUFFER) && t->buffer)
        free(t->buffer);
    free(it);
}

EXPORT int libusb_submit_transfer(struct libusb_transfer *t)
{
    if (!t || !t->dev_handle)
        return LIBUSB_ERROR_INVALID_PARAM;
    struct itransfer *it = priv_of(t);
    libusb_device_handle *h = t->dev_handle;
    libusb_context *ctx = h->ctx;
    int length = t->length;
    const unsigned char *payload = NULL;
    uint32_t plen = 0;
    if (t->type == LIBUSB_TRANSFER_TYPE_CONTROL) {
        if (!t->buffer || length < LIBUSB_CONTROL_SETUP_SIZE)
            return LIBUSB_ERROR_INVALID_PARAM;
        int wlength = get_u16(t->buffer + 6);
        if (wlength > length - LIBUSB_CONTROL_SETUP_SIZE)
            return LIBUSB_ERROR_INVALID_PARAM;
        payload = t->buffer;
        plen = LIBUSB_CONTROL_SETUP_SIZE + ((t->buffer[0] & LIBUSB_ENDPOINT_IN) ? 0 : wlength);
        length = wlength;
    } else if (t->type == LIBUSB_TRANSFER_TYPE_BULK || t->type == LIBUSB_TRANSFER_TYPE_INTERRUPT) {
        if (length < 0 || (length && !t->buffer))
            return LIBUSB_ERROR_INVALID_PARAM;
        if (!(t->endpoint & LIBUSB_ENDPOINT_IN)) {
            payload = t->buffer;
            plen = (uint32_t)length;
        }
    } else {
        return LIBUSB_ERROR_NOT_SUPPORTED;
    }

    pthread_mutex_lock(&ctx->lock);
    if (it->state != IDLE) {
        pthread_mutex_unlock(&ctx->lock);
        return LIBUSB_ERROR_BUSY;
    }
    if (ctx->dead) {
        pthread_mutex_unlock(&ctx->lock);
        return LIBUSB_ERROR_NO_DEVICE;
    }
    it->id = atomic_fetch_add(&next_id, 1);
    it->ctx = ctx;
    it->state = IN_FLIGHT;
    it->cancelled = 0;
    it->error = 0;
    it->submitted_at = now_s();
    it->handle_key = h->key;
    t->status = LIBUSB_TRANSFER_COMPLETED;
    t->actual_length = 0;
    it->next = ctx->in_flight;
    ctx->in_flight = it;
    pthread_mutex_unlock(&ctx->lock);

    uint64_t id = it->id;
    int endpoint = t->endpoint, type = t->type;
    int64_t args[8] = {h->key, endpoint, type, length, t->timeout, t->flags, 0};
    struct call c = {0};
    double limit = call_limit(0);
    /* From here on the transfer may complete (and be freed) in another thread. */
    int r = ask(ctx, &c, id, KIND_REPLY, OP_SUBMIT, args, payload, plen, limit);
    free(c.payload);
    if (r == 1) {
        send_cancel(ctx, id);
        shim_warn("libusb_submit_transfer", "no answer from the server within %.1f s", limit);
        r = LIBUSB_ERROR_IO;
    } else if (r == 0) {
        r = c.result < 0 ? c.result : 0;
    }
    if (r != 0) {
        /* Not submitted: take it back wherever it is, without a callback. */
        pthread_mutex_lock(&ctx->lock);
        if (unlink_in_flight(ctx, it) || unlink_done(ctx, it))
            it->state = IDLE;
        pthread_mutex_unlock(&ctx->lock);
    }
    shim_log("libusb_submit_transfer", (long long)id, h->key, endpoint, length, NONE,
             error_name(r), "type=%d timeout=%d", type, (int)args[4]);
    return r;
}

EXPORT int libusb_cancel_transfer(struct libusb_transfer *t)
{
    if (!t)
        return LIBUSB_ERROR_INVALID_PARAM;
    struct itransfer *it = priv_of(t);
    libusb_context *ctx = it->ctx;
    if (!ctx)
        return LIBUSB_ERROR_NOT_FOUND;
    pthread_mutex_lock(&ctx->lock);
    if (it->state != IN_FLIGHT || it->cancelled) {
        pthread_mutex_unlock(&ctx->lock);
        return LIBUSB_ERROR_NOT_FOUND;
    }
    it->cancelled = 1;
    it->cancel_at = now_s();
    uint64_t id = it->id;
    int endpoint = t->endpoint;
    pthread_mutex_unlock(&ctx->lock);
    /* The server answers with a completion (CANCELLED, or what the transfer got
     * before the cancel arrived), which libusb_handle_events delivers. */
    send_cancel(ctx, id);
    shim_log("libusb_cancel_transfer", (long long)id, NONE, endpoint, NONE, NONE,
             "LIBUSB_SUCCESS", NULL);
    return 0;
}

/* ---- libusb_handle_events* ------------------------------------------------------ */

/* Complete here what the server should have completed long ago (under ctx->lock). */
static void watchdog(libusb_context *ctx, double now)
{
    struct itransfer **p = &ctx->in_flight;
    while (*p) {
        struct itransfer *it = *p;
        struct libusb_transfer *t = pub_of(it);
        int status = -1;
        if (it->cancelled && now - it->cancel_at > GRACE)
            status = LIBUSB_TRANSFER_CANCELLED;
        else if (t->timeout && now - it->submitted_at > t->timeout / 1000.0 + GRACE)
            status = LIBUSB_TRANSFER_TIMED_OUT;
        if (status < 0) {
            p = &it->next;
            continue;
        }
        *p = it->next;
        t->status = (enum libusb_transfer_status)status;
        t->actual_length = 0;
        shim_log("watchdog", (long long)it->id, it->handle_key, t->endpoint, t->length, 0,
                 status_name(status), "the server did not complete the transfer in time");
        queue_done(ctx, it);
    }
}

static int handle_events_for(libusb_context *ctx, double wait, int *completed)
{
    ctx = ctx_or_default(ctx);
    if (!ctx)
        return LIBUSB_ERROR_INVALID_PARAM;
    double until = now_s() + wait;
    pthread_mutex_lock(&ctx->lock);
    unsigned seq = ctx->wake_seq;
    for (;;) {
        double now = now_s();
        watchdog(ctx, now);
        if (ctx->done_head && !ctx->delivering)
            break;
        if ((completed && *completed) || ctx->wake_seq != seq || now >= until)
            break;
        double step = now + 0.05 < until ? now + 0.05 : until;
        wait_until(&ctx->events_cond, &ctx->lock, step);
    }
    struct itransfer *batch = NULL;
    if (ctx->done_head && !ctx->delivering) {
        batch = ctx->done_head;
        ctx->done_head = ctx->done_tail = NULL;
        ctx->delivering = 1;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (!batch)
        return 0;

    /* Callbacks run in submission order per endpoint, one thread at a time. */
    while (batch) {
        struct itransfer *it = batch;
        batch = it->next;
        it->next = NULL;
        struct libusb_transfer *t = pub_of(it);
        pthread_mutex_lock(&ctx->lock);
        it->state = IDLE;
        pthread_mutex_unlock(&ctx->lock);
        int length = t->type == LIBUSB_TRANSFER_TYPE_CONTROL
                         ? t->length - LIBUSB_CONTROL_SETUP_SIZE : t->length;
        if (t->status == LIBUSB_TRANSFER_COMPLETED && (t->flags & LIBUSB_TRANSFER_SHORT_NOT_OK) &&
            t->actual_length < length)
            t->status = LIBUSB_TRANSFER_ERROR;
        shim_log("callback", (long long)it->id, it->handle_key,
                 t->endpoint, length, t->actual_length, status_name(t->status), NULL);
        uint8_t flags = t->flags;
        if (t->callback)
            t->callback(t);
        if (flags & LIBUSB_TRANSFER_FREE_TRANSFER)
            libusb_free_transfer(t);
    }
    pthread_mutex_lock(&ctx->lock);
    ctx->delivering = 0;
    pthread_cond_broadcast(&ctx->events_cond);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

static double wait_of(struct timeval *tv)
{
    settings();
    if (!tv)
        return EVENT_WAIT;
    double w = (double)tv->tv_sec + tv->tv_usec / 1e6;
    if (w < 0)
        w = 0;
    return w < max_wait ? w : max_wait;
}

EXPORT int libusb_handle_events(libusb_context *ctx)
{
    return handle_events_for(ctx, EVENT_WAIT, NULL);
}

EXPORT int libusb_handle_events_completed(libusb_context *ctx, int *completed)
{
    return handle_events_for(ctx, EVENT_WAIT, completed);
}

EXPORT int libusb_handle_events_timeout(libusb_context *ctx, struct timeval *tv)
{
    return handle_events_for(ctx, wait_of(tv), NULL);
}

EXPORT int libusb_handle_events_timeout_completed(libusb_context *ctx, struct timeval *tv,
                                                  int *completed)
{
    return handle_events_for(ctx, wait_of(tv), completed);
}
