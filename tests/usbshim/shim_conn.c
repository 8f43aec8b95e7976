/* The connection to the server: one socket and one reader thread per libusb
 * context.  The reader hands each answer to the thread waiting for it, or
 * queues a completed transfer for libusb_handle_events.  Part of the libusb
 * shim (shim_internal.h).
 */
#include "shim_internal.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

atomic_ullong next_id = 1;

/* ---- waits on the monotonic clock ----------------------------------------------- */

static struct timespec at_s(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* Wait on c until the monotonic time `until`; returns 0 if woken, ETIMEDOUT after. */
int wait_until(pthread_cond_t *c, pthread_mutex_t *m, double until)
{
    struct timespec ts = at_s(until);
    return pthread_cond_timedwait(c, m, &ts);
}

/* ---- the socket ----------------------------------------------------------------- */

static int read_full(int fd, unsigned char *p, size_t n)
{
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int connect_server(libusb_context *ctx)
{
    const char *path = getenv("CORALRT_USBSHIM_SOCKET");
    if (!path || !*path) {
        shim_warn("libusb_init", "CORALRT_USBSHIM_SOCKET is not set: no server to talk to");
        return LIBUSB_ERROR_IO;
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) {
        shim_warn("libusb_init", "socket path too long: %s", path);
        return LIBUSB_ERROR_IO;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        shim_warn("libusb_init", "cannot connect to %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return LIBUSB_ERROR_IO;
    }
    /* A server that stops reading must not block a sender for ever. */
    struct timeval tv = {(time_t)max_wait, (long)((max_wait - (time_t)max_wait) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    ctx->fd = fd;
    return 0;
}

/* ---- the context's lists of transfers (under ctx->lock) ------------------------- */

void queue_done(libusb_context *ctx, struct itransfer *it)
{
    it->state = DONE;
    it->next = NULL;
    if (ctx->done_tail)
        ctx->done_tail->next = it;
    else
        ctx->done_head = it;
    ctx->done_tail = it;
}

int unlink_in_flight(libusb_context *ctx, struct itransfer *it)
{
    for (struct itransfer **p = &ctx->in_flight; *p; p = &(*p)->next) {
        if (*p == it) {
            *p = it->next;
            it->next = NULL;
            return 1;
        }
    }
    return 0;
}

int unlink_done(libusb_context *ctx, struct itransfer *it)
{
    struct itransfer *prev = NULL;
    for (struct itransfer *p = ctx->done_head; p; prev = p, p = p->next) {
        if (p == it) {
            if (prev)
                prev->next = p->next;
            else
                ctx->done_head = p->next;
            if (ctx->done_tail == p)
                ctx->done_tail = prev;
            it->next = NULL;
            return 1;
        }
    }
    return 0;
}

/* ---- the reader ----------------------------------------------------------------- */

/* The server is gone: every waiting call and every transfer in flight fails. */
static void mark_dead(libusb_context *ctx, const char *why)
{
    pthread_mutex_lock(&ctx->lock);
    int first = !ctx->dead;
    ctx->dead = 1;
    for (struct call *c = ctx->calls; c; c = c->next) {
        if (!c->done) {
            c->done = 1;
            c->result = c->want_kind == KIND_COMPLETION ? LIBUSB_TRANSFER_NO_DEVICE
                                                        : LIBUSB_ERROR_NO_DEVICE;
            c->error = LIBUSB_ERROR_NO_DEVICE;
            c->actual = 0;
        }
    }
    while (ctx->in_flight) {
        struct itransfer *it = ctx->in_flight;
        ctx->in_flight = it->next;
        pub_of(it)->status = LIBUSB_TRANSFER_NO_DEVICE;
        pub_of(it)->actual_length = 0;
        it->error = LIBUSB_ERROR_NO_DEVICE;
        queue_done(ctx, it);
    }
    pthread_cond_broadcast(&ctx->calls_cond);
    pthread_cond_broadcast(&ctx->events_cond);
    int closing = ctx->closing;
    pthread_mutex_unlock(&ctx->lock);
    if (first && why && !closing)
        shim_warn("connection", "%s; calls now fail with LIBUSB_ERROR_NO_DEVICE", why);
}

/* Copy a completed IN transfer's data into its buffer and queue it for its callback. */
static void complete_transfer(libusb_context *ctx, struct itransfer *it, int status,
                              int actual, int error, const unsigned char *data, uint32_t len)
{
    struct libusb_transfer *t = pub_of(it);
    int control = t->type == LIBUSB_TRANSFER_TYPE_CONTROL;
    int room = control ? t->length - LIBUSB_CONTROL_SETUP_SIZE : t->length;
    if (room < 0)
        room = 0;
    int in = control ? (t->buffer && (t->buffer[0] & LIBUSB_ENDPOINT_IN))
                     : (t->endpoint & LIBUSB_ENDPOINT_IN);
    if (in && data && len) {
        uint32_t n = len < (uint32_t)room ? len : (uint32_t)room;
        memcpy(t->buffer + (control ? LIBUSB_CONTROL_SETUP_SIZE : 0), data, n);
    }
    if (actual > room)
        actual = room;
    t->status = (enum libusb_transfer_status)status;
    t->actual_length = actual < 0 ? 0 : actual;
    it->error = error;
    queue_done(ctx, it);
    pthread_cond_broadcast(&ctx->events_cond);
}

static void route(libusb_context *ctx, uint32_t kind, uint64_t id, int32_t result,
                  int32_t actual, int32_t error, unsigned char **payload, uint32_t len)
{
    pthread_mutex_lock(&ctx->lock);
    for (struct call *c = ctx->calls; c; c = c->next) {
        if (c->id == id && (int)kind == c->want_kind && !c->done) {
            c->result = result;
            c->actual = actual;
            c->error = error;
            if (c->in_buf) {
                uint32_t n = len < c->in_cap ? len : c->in_cap;
                if (n)
                    memcpy(c->in_buf, *payload, n);
                c->payload_len = n;
            } else {
                c->payload = *payload;   /* the caller frees it */
                c->payload_len = len;
                *payload = NULL;
            }
            c->done = 1;
            pthread_cond_broadcast(&ctx->calls_cond);
            pthread_mutex_unlock(&ctx->lock);
            return;
        }
    }
    if (kind == KIND_COMPLETION) {
        for (struct itransfer *it = ctx->in_flight; it; it = it->next) {
            if (it->id == id) {
                unlink_in_flight(ctx, it);
                complete_transfer(ctx, it, result, actual, error, *payload, len);
                break;
            }
        }
    }
    /* Anything else answers a call that gave up, or a transfer completed here. */
    pthread_mutex_unlock(&ctx->lock);
}

void *reader_main(void *arg)
{
    libusb_context *ctx = arg;
    unsigned char h[REPLY_HEADER];
    for (;;) {
        if (read_full(ctx->fd, h, 4) != 0)
            break;
        uint32_t len = get_u32(h);
        if (len < REPLY_HEADER - 4 || len - (REPLY_HEADER - 4) > MAX_PAYLOAD) {
            mark_dead(ctx, "malformed message from the server");
            return NULL;
        }
        if (read_full(ctx->fd, h + 4, REPLY_HEADER - 4) != 0)
            break;
        uint32_t plen = len - (REPLY_HEADER - 4);
        unsigned char *payload = plen ? malloc(plen) : NULL;
        if (plen && (!payload || read_full(ctx->fd, payload, plen) != 0)) {
            free(payload);
            break;
        }
        route(ctx, get_u32(h + 4), get_u64(h + 8), get_i32(h + 16), get_i32(h + 20),
              get_i32(h + 24), &payload, plen);
        free(payload);
    }
    mark_dead(ctx, "the server closed the connection");
    return NULL;
}

/* ---- requests ------------------------------------------------------------------- */

int send_frame(libusb_context *ctx, int op, uint64_t id, const int64_t args[8],
               const void *payload, uint32_t plen)
{
    unsigned char h[REQUEST_HEADER];
    put_u32(h, REQUEST_HEADER - 4 + plen);
    put_u32(h + 4, (uint32_t)op);
    put_u64(h + 8, id);
    for (int i = 0; i < 8; i++)
        put_u64(h + 16 + 8 * i, (uint64_t)(args ? args[i] : 0));
    pthread_mutex_lock(&ctx->write_lock);
    int bad = ctx->fd < 0 || write_full(ctx->fd, h, sizeof h) != 0 ||
              (plen && write_full(ctx->fd, payload, plen) != 0);
    pthread_mutex_unlock(&ctx->write_lock);
    if (bad) {
        mark_dead(ctx, "cannot send to the server");
        return LIBUSB_ERROR_NO_DEVICE;
    }
    return 0;
}

void send_cancel(libusb_context *ctx, uint64_t id)
{
    int64_t args[8] = {(int64_t)id};
    send_frame(ctx, OP_CANCEL, atomic_fetch_add(&next_id, 1), args, NULL, 0);
}

/* Send a request and wait up to `limit` seconds for the answer of kind
 * `want_kind`.  Returns 0 when answered (c holds it), LIBUSB_ERROR_NO_DEVICE
 * when the connection is gone, and 1 when the time ran out. */
int ask(libusb_context *ctx, struct call *c, uint64_t id, int want_kind, int op,
        const int64_t args[8], const void *payload, uint32_t plen, double limit)
{
    c->id = id ? id : atomic_fetch_add(&next_id, 1);
    c->want_kind = want_kind;
    c->done = 0;
    pthread_mutex_lock(&ctx->lock);
    if (ctx->dead) {
        pthread_mutex_unlock(&ctx->lock);
        return LIBUSB_ERROR_NO_DEVICE;
    }
    c->next = ctx->calls;
    ctx->calls = c;
    pthread_mutex_unlock(&ctx->lock);

    send_frame(ctx, op, c->id, args, payload, plen);   /* failure marks c done */

    double until = now_s() + limit;
    pthread_mutex_lock(&ctx->lock);
    while (!c->done && now_s() < until)
        wait_until(&ctx->calls_cond, &ctx->lock, until);
    for (struct call **p = &ctx->calls; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    int done = c->done;
    pthread_mutex_unlock(&ctx->lock);
    return done ? 0 : 1;
}

/* A request that answers with one number (>= 0, or a libusb error). */
int simple_call(libusb_context *ctx, const char *name, int op, long long handle,
                int64_t a1, int64_t a2, double limit)
{
    if (!ctx)
        return LIBUSB_ERROR_INVALID_PARAM;
    int64_t args[8] = {handle, a1, a2};
    struct call c = {0};
    int r = ask(ctx, &c, 0, KIND_REPLY, op, args, NULL, 0, limit);
    free(c.payload);
    if (r == 1) {
        shim_warn(name, "no answer from the server within %.1f s", limit);
        r = LIBUSB_ERROR_IO;
    } else if (r == 0) {
        r = c.result;
    }
    shim_log(name, (long long)c.id, handle, NONE, NONE, NONE, error_name(r),
             "args=%lld,%lld result=%d", (long long)a1, (long long)a2, r);
    return r;
}
