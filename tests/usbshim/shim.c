/* A stand-in for libusb-1.0 that forwards every call to a Python process.
 *
 * Built as libusb-1.0.so.0 and put first on LD_LIBRARY_PATH (or loaded by
 * path, as pyusb's find_library allows), it lets a native program that links
 * libusb-1.0 (Google's libedgetpu) or pyusb's libusb1 backend talk to a
 * simulated Coral stick served by tests/usbshim/server.py over the Unix
 * socket named by CORALRT_USBSHIM_SOCKET.  See README.md in this folder for
 * the wire format and the log format.
 *
 * Each libusb context owns one connection and one reader thread.  The reader
 * routes every message from the server either to the thread waiting for that
 * answer (synchronous calls) or to the context's queue of completed transfers,
 * whose callbacks run inside libusb_handle_events* in the calling thread, as
 * with the real libusb.  Every wait is bounded: libusb_handle_events returns
 * after at most 100 ms, synchronous calls give up after their own timeout plus
 * a grace period (capped by CORALRT_USBSHIM_MAX_WAIT seconds, default 30), and
 * a lost connection fails every call and transfer with NO_DEVICE.
 *
 * Plain C11 and POSIX threads; no code of libusb's own is used.
 */
#define _GNU_SOURCE
#include "shim_abi.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- wire format (see README.md) ---------------------------------------------- */

enum {
    OP_HELLO = 1, OP_DEVICE_LIST = 2, OP_OPEN = 3, OP_CLOSE = 4, OP_SET_CONFIGURATION = 5,
    OP_GET_CONFIGURATION = 6, OP_CLAIM = 7, OP_RELEASE = 8, OP_SET_ALT = 9,
    OP_CLEAR_HALT = 10, OP_RESET = 11, OP_KERNEL_DRIVER_ACTIVE = 12,
    OP_DETACH_KERNEL_DRIVER = 13, OP_ATTACH_KERNEL_DRIVER = 14, OP_CONTROL = 15,
    OP_SUBMIT = 16, OP_CANCEL = 17
};
enum { KIND_REPLY = 1, KIND_COMPLETION = 2 };

#define REQUEST_HEADER 80   /* u32 length, u32 op, u64 id, i64 args[8] */
#define REPLY_HEADER 32     /* u32 length, u32 kind, u64 id, i32 result, actual, error, spare */
#define MAX_PAYLOAD (256u << 20)

#define EVENT_WAIT 0.1      /* longest libusb_handle_events waits for an event, seconds */
#define GRACE 2.0           /* how much longer than its own timeout a call waits, seconds */

/* ---- small helpers ------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

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

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static int32_t get_i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static int64_t get_i64(const unsigned char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static void cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* Wait on c until the monotonic time `until`; returns 0 if woken, ETIMEDOUT after. */
static int wait_until(pthread_cond_t *c, pthread_mutex_t *m, double until)
{
    struct timespec ts = at_s(until);
    return pthread_cond_timedwait(c, m, &ts);
}

static const char *error_name(int code)
{
    switch (code) {
    case LIBUSB_SUCCESS: return "LIBUSB_SUCCESS";
    case LIBUSB_ERROR_IO: return "LIBUSB_ERROR_IO";
    case LIBUSB_ERROR_INVALID_PARAM: return "LIBUSB_ERROR_INVALID_PARAM";
    case LIBUSB_ERROR_ACCESS: return "LIBUSB_ERROR_ACCESS";
    case LIBUSB_ERROR_NO_DEVICE: return "LIBUSB_ERROR_NO_DEVICE";
    case LIBUSB_ERROR_NOT_FOUND: return "LIBUSB_ERROR_NOT_FOUND";
    case LIBUSB_ERROR_BUSY: return "LIBUSB_ERROR_BUSY";
    case LIBUSB_ERROR_TIMEOUT: return "LIBUSB_ERROR_TIMEOUT";
    case LIBUSB_ERROR_OVERFLOW: return "LIBUSB_ERROR_OVERFLOW";
    case LIBUSB_ERROR_PIPE: return "LIBUSB_ERROR_PIPE";
    case LIBUSB_ERROR_INTERRUPTED: return "LIBUSB_ERROR_INTERRUPTED";
    case LIBUSB_ERROR_NO_MEM: return "LIBUSB_ERROR_NO_MEM";
    case LIBUSB_ERROR_NOT_SUPPORTED: return "LIBUSB_ERROR_NOT_SUPPORTED";
    default: return code > 0 ? "LIBUSB_SUCCESS" : "LIBUSB_ERROR_OTHER";
    }
}

static const char *status_name(int status)
{
    switch (status) {
    case LIBUSB_TRANSFER_COMPLETED: return "LIBUSB_TRANSFER_COMPLETED";
    case LIBUSB_TRANSFER_ERROR: return "LIBUSB_TRANSFER_ERROR";
    case LIBUSB_TRANSFER_TIMED_OUT: return "LIBUSB_TRANSFER_TIMED_OUT";
    case LIBUSB_TRANSFER_CANCELLED: return "LIBUSB_TRANSFER_CANCELLED";
    case LIBUSB_TRANSFER_STALL: return "LIBUSB_TRANSFER_STALL";
    case LIBUSB_TRANSFER_NO_DEVICE: return "LIBUSB_TRANSFER_NO_DEVICE";
    case LIBUSB_TRANSFER_OVERFLOW: return "LIBUSB_TRANSFER_OVERFLOW";
    default: return "LIBUSB_TRANSFER_ERROR";
    }
}

/* The error a synchronous transfer returns for a transfer status. */
static int status_error(int status)
{
    switch (status) {
    case LIBUSB_TRANSFER_COMPLETED: return LIBUSB_SUCCESS;
    case LIBUSB_TRANSFER_TIMED_OUT: return LIBUSB_ERROR_TIMEOUT;
    case LIBUSB_TRANSFER_STALL: return LIBUSB_ERROR_PIPE;
    case LIBUSB_TRANSFER_NO_DEVICE: return LIBUSB_ERROR_NO_DEVICE;
    case LIBUSB_TRANSFER_OVERFLOW: return LIBUSB_ERROR_OVERFLOW;
    default: return LIBUSB_ERROR_IO;
    }
}

/* ---- settings from the environment --------------------------------------------- */

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static int log_fd = -1;
static double max_wait = 30.0;

static void read_settings(void)
{
    const char *path = getenv("CORALRT_USBSHIM_LOG");
    if (path && *path)
        log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    const char *wait = getenv("CORALRT_USBSHIM_MAX_WAIT");
    if (wait && *wait) {
        char *end = NULL;
        double v = strtod(wait, &end);
        if (end != wait && v > 0)
            max_wait = v;
    }
}

static void settings(void) { pthread_once(&settings_once, read_settings); }

/* How long a synchronous call with libusb timeout `timeout_ms` (0: none) waits. */
static double call_limit(unsigned int timeout_ms)
{
    settings();
    double limit = timeout_ms ? timeout_ms / 1000.0 + GRACE : max_wait;
    return limit < max_wait ? limit : max_wait;
}

/* ---- the JSON-lines log (format in README.md) ---------------------------------- */

#define NONE LLONG_MIN

static size_t json_string(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    if (n < cap) out[n++] = '"';
    for (; s && *s && n + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[n++] = '\\';
            out[n++] = (char)ch;
        } else if (ch < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", ch);
        } else {
            out[n++] = (char)ch;
        }
    }
    if (n < cap) out[n++] = '"';
    return n;
}

static size_t json_int(char *out, size_t cap, long long v)
{
    return (size_t)snprintf(out, cap, v == NONE ? "null" : "%lld", v);
}

/* One line: {"t", "side", "pid", "call", "id", "handle", "ep", "length", "actual",
 * "status", "detail"}; NONE (or a NULL string) is written as null. */
static void shim_log(const char *call, long long id, long long handle, long long ep,
                     long long length, long long actual, const char *status,
                     const char *fmt, ...)
{
    settings();
    if (log_fd < 0)
        return;
    char detail[512] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    char line[1200];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"t\": %.6f, \"side\": \"shim\", \"pid\": %d, "
                                "\"call\": ", now_s(), (int)getpid());
    n += json_string(line + n, sizeof line - n, call);
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"id\": ");
    n += json_int(line + n, sizeof line - n, id);
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"handle\": ");
    n += json_int(line + n, sizeof line - n, handle);
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"ep\": ");
    n += json_int(line + n, sizeof line - n, ep);
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"length\": ");
    n += json_int(line + n, sizeof line - n, length);
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"actual\": ");
    n += json_int(line + n, sizeof line - n, actual);
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"status\": ");
    if (status)
        n += json_string(line + n, sizeof line - n, status);
    else
        n += (size_t)snprintf(line + n, sizeof line - n, "null");
    n += (size_t)snprintf(line + n, sizeof line - n, ", \"detail\": ");
    if (fmt)
        n += json_string(line + n, sizeof line - n - 3, detail);
    else
        n += (size_t)snprintf(line + n, sizeof line - n, "null");
    if (n > sizeof line - 3)
        n = sizeof line - 3;
    line[n++] = '}';
    line[n++] = '\n';
    ssize_t w = write(log_fd, line, n);   /* one write per line (O_APPEND) */
    (void)w;
}

/* A problem worth seeing even without a log file: to stderr as well. */
static void shim_warn(const char *call, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "coralrt usbshim (pid %d): %s: %s\n", (int)getpid(), call, text);
    shim_log(call, NONE, NONE, NONE, NONE, NONE, "LIBUSB_ERROR_IO", "%s", text);
}

/* ---- contexts, devices, handles, transfers -------------------------------------- */

struct call {                    /* a thread waiting for the server's answer */
    uint64_t id;
    int want_kind;
    int done;
    int32_t result, actual, error;
    unsigned char *in_buf;       /* where the answer's payload goes (may be NULL) */
    uint32_t in_cap;
    unsigned char *payload;      /* or: the payload itself (when in_buf is NULL) */
    uint32_t payload_len;
    struct call *next;
};

struct itransfer {               /* lives just before the public libusb_transfer */
    uint64_t id;
    libusb_context *ctx;
    int state;                   /* IDLE, IN_FLIGHT, DONE (callback pending) */
    int cancelled;
    double submitted_at, cancel_at;
    int32_t error;               /* the libusb error the server reported, or 0 */
    int64_t handle_key;          /* for the log: the handle may be gone by the callback */
    struct itransfer *next;
};
enum { IDLE = 0, IN_FLIGHT = 1, DONE = 2 };

#define PRIV_SIZE ((sizeof(struct itransfer) + 15) & ~(size_t)15)

static struct itransfer *priv_of(struct libusb_transfer *t)
{
    return (struct itransfer *)((char *)t - PRIV_SIZE);
}

static struct libusb_transfer *pub_of(struct itransfer *it)
{
    return (struct libusb_transfer *)((char *)it + PRIV_SIZE);
}

struct libusb_context {
    pthread_mutex_t lock;        /* calls, transfers, dead, wake_seq, delivering */
    pthread_cond_t calls_cond;   /* answers for waiting calls */
    pthread_cond_t events_cond;  /* completed transfers, wake-ups */
    pthread_mutex_t write_lock;  /* one frame at a time on the socket */
    int fd;
    int dead;
    int closing;                 /* libusb_exit is shutting the connection */
    pthread_t reader;
    int reader_started;
    struct call *calls;
    struct itransfer *in_flight;
    struct itransfer *done_head, *done_tail;
    unsigned wake_seq;
    int delivering;              /* a thread is running callbacks */
    libusb_device *devices;      /* under dev_lock */
};

struct libusb_device {
    libusb_context *ctx;         /* NULL once the context is gone */
    int refs;
    int64_t key;                 /* the server's name for it */
    uint8_t bus, address, speed, nports;
    uint8_t ports[7];
    unsigned char descriptor[18];
    int nconfigs;
    unsigned char *configs[8];
    int config_len[8];
    libusb_device *next;
};

struct libusb_device_handle {
    libusb_context *ctx;
    libusb_device *dev;
    int64_t key;
};

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;   /* device lists, refs */
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static libusb_context *default_ctx;
static int default_refs;
static atomic_ullong next_id = 1;     /* ids are unique within the process */

static libusb_context *ctx_or_default(libusb_context *ctx)
{
    if (ctx)
        return ctx;
    pthread_mutex_lock(&default_lock);
    ctx = default_ctx;
    pthread_mutex_unlock(&default_lock);
    return ctx;
}

/* ---- the connection ------------------------------------------------------------ */

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

static void queue_done(libusb_context *ctx, struct itransfer *it)
{
    it->state = DONE;
    it->next = NULL;
    if (ctx->done_tail)
        ctx->done_tail->next = it;
    else
        ctx->done_head = it;
    ctx->done_tail = it;
}

static int unlink_in_flight(libusb_context *ctx, struct itransfer *it)
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

static int unlink_done(libusb_context *ctx, struct itransfer *it)
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

static void *reader_main(void *arg)
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

static int send_frame(libusb_context *ctx, int op, uint64_t id, const int64_t args[8],
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

/* Send a request and wait up to `limit` seconds for the answer of kind
 * `want_kind`.  Returns 0 when answered (c holds it), LIBUSB_ERROR_NO_DEVICE
 * when the connection is gone, and 1 when the time ran out. */
static int ask(libusb_context *ctx, struct call *c, uint64_t id, int want_kind, int op,
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
static int simple_call(libusb_context *ctx, const char *name, int op, long long handle,
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

/* ---- library, contexts ---------------------------------------------------------- */

static int connect_server(libusb_context *ctx)
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
        if (ctx->fd >= 0)
            shutdown(ctx->fd, SHUT_RDWR);
        if (ctx->reader_started)
            pthread_join(ctx->reader, NULL);
        if (ctx->fd >= 0)
            close(ctx->fd);
        free(ctx);
        return r;
    }
    if (out) {
        *out = ctx;
    } else {
        pthread_mutex_lock(&default_lock);
        if (default_ctx) {            /* another thread won the race */
            default_refs++;
            pthread_mutex_unlock(&default_lock);
            shutdown(ctx->fd, SHUT_RDWR);
            pthread_join(ctx->reader, NULL);
            close(ctx->fd);
            free(ctx);
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

EXPORT const char *libusb_error_name(int code)
{
    if (code >= 0 && code <= LIBUSB_TRANSFER_OVERFLOW && code != 0)
        return status_name(code);
    return error_name(code);
}

EXPORT const char *libusb_strerror(int code)
{
    switch (code) {
    case LIBUSB_SUCCESS: return "Success";
    case LIBUSB_ERROR_IO: return "Input/Output Error";
    case LIBUSB_ERROR_INVALID_PARAM: return "Invalid parameter";
    case LIBUSB_ERROR_ACCESS: return "Access denied (insufficient permissions)";
    case LIBUSB_ERROR_NO_DEVICE: return "No such device (it may have been disconnected)";
    case LIBUSB_ERROR_NOT_FOUND: return "Entity not found";
    case LIBUSB_ERROR_BUSY: return "Resource busy";
    case LIBUSB_ERROR_TIMEOUT: return "Operation timed out";
    case LIBUSB_ERROR_OVERFLOW: return "Overflow";
    case LIBUSB_ERROR_PIPE: return "Pipe error";
    case LIBUSB_ERROR_INTERRUPTED: return "System call interrupted (perhaps due to signal)";
    case LIBUSB_ERROR_NO_MEM: return "Insufficient memory";
    case LIBUSB_ERROR_NOT_SUPPORTED:
        return "Operation not supported or unimplemented on this platform";
    default: return "Other error";
    }
}

/* ---- devices ------------------------------------------------------------------- */

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

EXPORT int libusb_get_device_descriptor(libusb_device *d, struct libusb_device_descriptor *desc)
{
    const unsigned char *b = d->descriptor;
    desc->bLength = b[0];
    desc->bDescriptorType = b[1];
    desc->bcdUSB = get_u16(b + 2);
    desc->bDeviceClass = b[4];
    desc->bDeviceSubClass = b[5];
    desc->bDeviceProtocol = b[6];
    desc->bMaxPacketSize0 = b[7];
    desc->idVendor = get_u16(b + 8);
    desc->idProduct = get_u16(b + 10);
    desc->bcdDevice = get_u16(b + 12);
    desc->iManufacturer = b[14];
    desc->iProduct = b[15];
    desc->iSerialNumber = b[16];
    desc->bNumConfigurations = b[17];
    return 0;
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

/* ---- configuration descriptors: parsed from the raw bytes ----------------------- */

struct owned_config {            /* what libusb_get_config_descriptor hands out */
    struct libusb_config_descriptor pub;   /* first: same address */
    unsigned char *raw;
};

static void free_config(struct libusb_config_descriptor *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->bNumInterfaces && cfg->interface; i++) {
        const struct libusb_interface *in = &cfg->interface[i];
        for (int a = 0; a < in->num_altsetting; a++)
            free((void *)in->altsetting[a].endpoint);
        free((void *)in->altsetting);
    }
    free((void *)cfg->interface);
    free(((struct owned_config *)cfg)->raw);
    free(cfg);
}

/* Length of the run of descriptors at p (up to end) that are not of the types
 * that end it (interface, and endpoint when stop_at_endpoint). */
static int extra_run(const unsigned char *p, const unsigned char *end, int stop_at_endpoint)
{
    const unsigned char *q = p;
    while (q + 2 <= end && q[0] >= 2 && q + q[0] <= end) {
        if (q[1] == LIBUSB_DT_INTERFACE || (stop_at_endpoint && q[1] == LIBUSB_DT_ENDPOINT))
            break;
        q += q[0];
    }
    return (int)(q - p);
}

static int parse_config(const unsigned char *src, int len, struct libusb_config_descriptor **out)
{
    if (len < 9 || src[1] != LIBUSB_DT_CONFIG)
        return LIBUSB_ERROR_IO;
    struct owned_config *oc = calloc(1, sizeof *oc);
    if (!oc)
        return LIBUSB_ERROR_NO_MEM;
    oc->raw = malloc((size_t)len);
    if (!oc->raw) {
        free(oc);
        return LIBUSB_ERROR_NO_MEM;
    }
    memcpy(oc->raw, src, (size_t)len);
    const unsigned char *raw = oc->raw, *end = raw + len;
    struct libusb_config_descriptor *cfg = &oc->pub;
    cfg->bLength = raw[0];
    cfg->bDescriptorType = raw[1];
    cfg->wTotalLength = get_u16(raw + 2);
    cfg->bNumInterfaces = raw[4];
    cfg->bConfigurationValue = raw[5];
    cfg->iConfiguration = raw[6];
    cfg->bmAttributes = raw[7];
    cfg->MaxPower = raw[8];
    const unsigned char *p = raw + raw[0];
    int n = extra_run(p, end, 0);
    cfg->extra = n ? p : NULL;
    cfg->extra_length = n;
    p += n;

    struct libusb_interface *ifs =
        calloc(cfg->bNumInterfaces ? cfg->bNumInterfaces : 1, sizeof *ifs);
    cfg->interface = ifs;
    if (!ifs) {
        free_config(cfg);
        return LIBUSB_ERROR_NO_MEM;
    }
    /* Interface descriptors in order; alternate settings of one interface follow
     * each other.  Interface numbers are taken as 0 .. bNumInterfaces-1. */
    while (p + 9 <= end && p[0] >= 9 && p[1] == LIBUSB_DT_INTERFACE) {
        int number = p[2];
        if (number >= cfg->bNumInterfaces)
            break;
        struct libusb_interface *in = &ifs[number];
        struct libusb_interface_descriptor *alts =
            realloc((void *)in->altsetting, (size_t)(in->num_altsetting + 1) * sizeof *alts);
        if (!alts) {
            free_config(cfg);
            return LIBUSB_ERROR_NO_MEM;
        }
        in->altsetting = alts;
        struct libusb_interface_descriptor *d = &alts[in->num_altsetting++];
        memset(d, 0, sizeof *d);
        d->bLength = p[0];
        d->bDescriptorType = p[1];
        d->bInterfaceNumber = p[2];
        d->bAlternateSetting = p[3];
        d->bNumEndpoints = p[4];
        d->bInterfaceClass = p[5];
        d->bInterfaceSubClass = p[6];
        d->bInterfaceProtocol = p[7];
        d->iInterface = p[8];
        p += p[0];
        n = extra_run(p, end, 1);
        d->extra = n ? p : NULL;
        d->extra_length = n;
        p += n;
        struct libusb_endpoint_descriptor *eps =
            calloc(d->bNumEndpoints ? d->bNumEndpoints : 1, sizeof *eps);
        d->endpoint = eps;
        if (!eps) {
            free_config(cfg);
            return LIBUSB_ERROR_NO_MEM;
        }
        int k = 0;
        while (k < d->bNumEndpoints && p + 7 <= end && p[0] >= 7 && p[1] == LIBUSB_DT_ENDPOINT) {
            struct libusb_endpoint_descriptor *e = &eps[k++];
            e->bLength = p[0];
            e->bDescriptorType = p[1];
            e->bEndpointAddress = p[2];
            e->bmAttributes = p[3];
            e->wMaxPacketSize = get_u16(p + 4);
            e->bInterval = p[6];
            if (p[0] >= 9) {
                e->bRefresh = p[7];
                e->bSynchAddress = p[8];
            }
            p += p[0];
            n = extra_run(p, end, 1);
            e->extra = n ? p : NULL;
            e->extra_length = n;
            p += n;
        }
        d->bNumEndpoints = (uint8_t)k;
    }
    *out = cfg;
    return 0;
}

EXPORT int libusb_get_config_descriptor(libusb_device *d, uint8_t index,
                                        struct libusb_config_descriptor **config)
{
    if (index >= d->nconfigs)
        return LIBUSB_ERROR_NOT_FOUND;
    return parse_config(d->configs[index], d->config_len[index], config);
}

EXPORT int libusb_get_active_config_descriptor(libusb_device *d,
                                               struct libusb_config_descriptor **config)
{
    return libusb_get_config_descriptor(d, 0, config);
}

EXPORT int libusb_get_config_descriptor_by_value(libusb_device *d, uint8_t value,
                                                 struct libusb_config_descriptor **config)
{
    for (int i = 0; i < d->nconfigs; i++)
        if (d->config_len[i] >= 9 && d->configs[i][5] == value)
            return parse_config(d->configs[i], d->config_len[i], config);
    return LIBUSB_ERROR_NOT_FOUND;
}

EXPORT void libusb_free_config_descriptor(struct libusb_config_descriptor *config)
{
    free_config(config);
}

static int endpoint_size(libusb_device *d, unsigned char endpoint)
{
    struct libusb_config_descriptor *cfg;
    if (libusb_get_config_descriptor(d, 0, &cfg) != 0)
        return LIBUSB_ERROR_NOT_FOUND;
    int size = LIBUSB_ERROR_NOT_FOUND;
    for (int i = 0; i < cfg->bNumInterfaces; i++)
        for (int a = 0; a < cfg->interface[i].num_altsetting; a++) {
            const struct libusb_interface_descriptor *in = &cfg->interface[i].altsetting[a];
            for (int e = 0; e < in->bNumEndpoints; e++)
                if (in->endpoint[e].bEndpointAddress == endpoint && size < 0)
                    size = in->endpoint[e].wMaxPacketSize & 0x7ff;
        }
    free_config(cfg);
    return size;
}

EXPORT int libusb_get_max_packet_size(libusb_device *d, unsigned char endpoint)
{
    return endpoint_size(d, endpoint);
}

EXPORT int libusb_get_max_iso_packet_size(libusb_device *d, unsigned char endpoint)
{
    return endpoint_size(d, endpoint);
}

/* ---- handles -------------------------------------------------------------------- */

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

EXPORT int libusb_set_configuration(libusb_device_handle *h, int value)
{
    return simple_call(h->ctx, "libusb_set_configuration", OP_SET_CONFIGURATION, h->key,
                       value, 0, call_limit(0));
}

EXPORT int libusb_get_configuration(libusb_device_handle *h, int *value)
{
    int r = simple_call(h->ctx, "libusb_get_configuration", OP_GET_CONFIGURATION, h->key,
                        0, 0, call_limit(0));
    if (r < 0)
        return r;
    *value = r;
    return 0;
}

EXPORT int libusb_claim_interface(libusb_device_handle *h, int number)
{
    return simple_call(h->ctx, "libusb_claim_interface", OP_CLAIM, h->key, number, 0,
                       call_limit(0));
}

EXPORT int libusb_release_interface(libusb_device_handle *h, int number)
{
    return simple_call(h->ctx, "libusb_release_interface", OP_RELEASE, h->key, number, 0,
                       call_limit(0));
}

EXPORT int libusb_set_interface_alt_setting(libusb_device_handle *h, int number, int alt)
{
    return simple_call(h->ctx, "libusb_set_interface_alt_setting", OP_SET_ALT, h->key,
                       number, alt, call_limit(0));
}

EXPORT int libusb_clear_halt(libusb_device_handle *h, unsigned char endpoint)
{
    return simple_call(h->ctx, "libusb_clear_halt", OP_CLEAR_HALT, h->key, endpoint, 0,
                       call_limit(0));
}

EXPORT int libusb_reset_device(libusb_device_handle *h)
{
    return simple_call(h->ctx, "libusb_reset_device", OP_RESET, h->key, 0, 0, call_limit(0));
}

EXPORT int libusb_kernel_driver_active(libusb_device_handle *h, int number)
{
    return simple_call(h->ctx, "libusb_kernel_driver_active", OP_KERNEL_DRIVER_ACTIVE,
                       h->key, number, 0, call_limit(0));
}

EXPORT int libusb_detach_kernel_driver(libusb_device_handle *h, int number)
{
    return simple_call(h->ctx, "libusb_detach_kernel_driver", OP_DETACH_KERNEL_DRIVER,
                       h->key, number, 0, call_limit(0));
}

EXPORT int libusb_attach_kernel_driver(libusb_device_handle *h, int number)
{
    return simple_call(h->ctx, "libusb_attach_kernel_driver", OP_ATTACH_KERNEL_DRIVER,
                       h->key, number, 0, call_limit(0));
}

EXPORT int libusb_set_auto_detach_kernel_driver(libusb_device_handle *h, int enable)
{
    (void)h;
    (void)enable;
    return LIBUSB_SUCCESS;
}

/* ---- synchronous transfers ------------------------------------------------------ */

EXPORT int libusb_control_transfer(libusb_device_handle *h, uint8_t request_type,
                                   uint8_t request, uint16_t value, uint16_t index,
                                   unsigned char *data, uint16_t length, unsigned int timeout)
{
    if (!h)
        return LIBUSB_ERROR_INVALID_PARAM;
    int in = request_type & LIBUSB_ENDPOINT_IN;
    int64_t args[8] = {h->key, request_type, request, value, index, length, timeout};
    struct call c = {0};
    c.in_buf = in ? data : NULL;
    c.in_cap = in ? length : 0;
    double limit = call_limit(timeout);
    int r = ask(h->ctx, &c, 0, KIND_REPLY, OP_CONTROL, args, in ? NULL : data,
                in ? 0 : length, limit);
    if (!c.in_buf)
        free(c.payload);
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
    c.in_buf = in ? data : NULL;
    c.in_cap = in ? (uint32_t)length : 0;
    double limit = call_limit(timeout);
    int r = ask(h->ctx, &c, 0, KIND_COMPLETION, OP_SUBMIT, args, in ? NULL : data,
                in ? 0 : (uint32_t)length, limit);
    if (!c.in_buf)
        free(c.payload);
    int actual = 0;
    const char *status;
    if (r == 1) {
        /* Take the transfer back, so that it cannot eat data later. */
        int64_t cancel[8] = {(int64_t)c.id};
        send_frame(h->ctx, OP_CANCEL, atomic_fetch_add(&next_id, 1), cancel, NULL, 0);
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

/* ---- asynchronous transfers ----------------------------------------------------- */

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
        int64_t cancel[8] = {(int64_t)id};
        send_frame(ctx, OP_CANCEL, atomic_fetch_add(&next_id, 1), cancel, NULL, 0);
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
    int64_t args[8] = {(int64_t)id};
    send_frame(ctx, OP_CANCEL, atomic_fetch_add(&next_id, 1), args, NULL, 0);
    shim_log("libusb_cancel_transfer", (long long)id, NONE, endpoint, NONE, NONE,
             "LIBUSB_SUCCESS", NULL);
    return 0;
}

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
