/* A stand-in for libusb-1.0 that forwards every call to a Python process:
 * what the shim's source files share (not part of the libusb ABI).
 *
 * Built as libusb-1.0.so.0 and put first on LD_LIBRARY_PATH (or loaded by
 * path, as pyusb's find_library allows), it lets a native program that links
 * libusb-1.0 (Google's libedgetpu) or pyusb's libusb1 backend talk to a
 * simulated Coral stick served by tests/usbshim/server.py over the Unix
 * socket named by CORALRT_USBSHIM_SOCKET.  See README.md in this folder for
 * the wire format, the log format and which file holds what.
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
 * Plain C11 and POSIX threads; no code of libusb's own is used.  Only the
 * functions marked EXPORT are visible outside the library (it is built with
 * -fvisibility=hidden).
 */
#ifndef CORALRT_USBSHIM_INTERNAL_H
#define CORALRT_USBSHIM_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "shim_abi.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- wire format (see README.md) ------------------------------------------------ */

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

#define NONE LLONG_MIN      /* a log field written as null */

/* ---- small helpers -------------------------------------------------------------- */

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t get_i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int64_t get_i64(const unsigned char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

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

static inline struct itransfer *priv_of(struct libusb_transfer *t)
{
    return (struct itransfer *)((char *)t - PRIV_SIZE);
}

static inline struct libusb_transfer *pub_of(struct itransfer *it)
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

/* ---- shim_log.c: settings from the environment, the JSON-lines log -------------- */

extern double max_wait;          /* CORALRT_USBSHIM_MAX_WAIT, seconds (after settings()) */
void settings(void);
/* How long a synchronous call with libusb timeout `timeout_ms` (0: none) waits. */
double call_limit(unsigned int timeout_ms);
/* One log line; NONE (or a NULL string) is written as null, and so is the
 * detail when fmt is NULL. */
void shim_log(const char *call, long long id, long long handle, long long ep,
              long long length, long long actual, const char *status, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* A problem worth seeing even without a log file: to stderr as well. */
void shim_warn(const char *call, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- shim_errors.c: names of codes ---------------------------------------------- */

const char *error_name(int code);
const char *status_name(int status);
/* The error a synchronous transfer returns for a transfer status. */
int status_error(int status);

/* ---- shim_conn.c: the connection to the server ---------------------------------- */

extern atomic_ullong next_id;    /* request ids, unique within the process */
void cond_init(pthread_cond_t *c);
/* Wait on c until the monotonic time `until`; returns 0 if woken, ETIMEDOUT after. */
int wait_until(pthread_cond_t *c, pthread_mutex_t *m, double until);
int connect_server(libusb_context *ctx);
void *reader_main(void *arg);
int send_frame(libusb_context *ctx, int op, uint64_t id, const int64_t args[8],
               const void *payload, uint32_t plen);
/* Ask the server to take back transfer `id` (a cancel needs no answer). */
void send_cancel(libusb_context *ctx, uint64_t id);
/* Send a request and wait up to `limit` seconds for the answer of kind
 * `want_kind`.  Returns 0 when answered (c holds it), LIBUSB_ERROR_NO_DEVICE
 * when the connection is gone, and 1 when the time ran out. */
int ask(libusb_context *ctx, struct call *c, uint64_t id, int want_kind, int op,
        const int64_t args[8], const void *payload, uint32_t plen, double limit);
/* A request that answers with one number (>= 0, or a libusb error). */
int simple_call(libusb_context *ctx, const char *name, int op, long long handle,
                int64_t a1, int64_t a2, double limit);
/* The transfer queues of a context (under ctx->lock). */
void queue_done(libusb_context *ctx, struct itransfer *it);
int unlink_in_flight(libusb_context *ctx, struct itransfer *it);
int unlink_done(libusb_context *ctx, struct itransfer *it);

/* ---- shim_context.c, shim_devices.c --------------------------------------------- */

libusb_context *ctx_or_default(libusb_context *ctx);
extern pthread_mutex_t dev_lock; /* device lists, refs */

/* Exported functions that other files of the shim call. */
EXPORT libusb_device *libusb_ref_device(libusb_device *d);
EXPORT void libusb_unref_device(libusb_device *d);
EXPORT ssize_t libusb_get_device_list(libusb_context *ctx, libusb_device ***list);
EXPORT void libusb_free_device_list(libusb_device **list, int unref);
EXPORT int libusb_get_device_descriptor(libusb_device *d, struct libusb_device_descriptor *desc);
EXPORT int libusb_control_transfer(libusb_device_handle *h, uint8_t request_type,
                                   uint8_t request, uint16_t value, uint16_t index,
                                   unsigned char *data, uint16_t length, unsigned int timeout);
EXPORT void libusb_free_transfer(struct libusb_transfer *t);

#endif
