/* Settings from the environment (CORALRT_USBSHIM_LOG,
 * CORALRT_USBSHIM_MAX_WAIT) and the JSON-lines log that both sides append to
 * (format in README.md).  Part of the libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

/* ---- settings from the environment ---------------------------------------------- */

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static int log_fd = -1;
double max_wait = 30.0;

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

void settings(void) { pthread_once(&settings_once, read_settings); }

/* How long a synchronous call with libusb timeout `timeout_ms` (0: none) waits. */
double call_limit(unsigned int timeout_ms)
{
    settings();
    double limit = timeout_ms ? timeout_ms / 1000.0 + GRACE : max_wait;
    return limit < max_wait ? limit : max_wait;
}

/* ---- the JSON-lines log (format in README.md) ----------------------------------- */

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

/* Append `, "key": v` (null for NONE) to the line of length n; returns its new length. */
static size_t json_int_field(char *line, size_t cap, size_t n, const char *key, long long v)
{
    n += (size_t)snprintf(line + n, cap - n, ", \"%s\": ", key);
    return n + json_int(line + n, cap - n, v);
}

/* One line: {"t", "side", "pid", "call", "id", "handle", "ep", "length", "actual",
 * "status", "detail"}; NONE (or a NULL string) is written as null. */
void shim_log(const char *call, long long id, long long handle, long long ep,
              long long length, long long actual, const char *status, const char *fmt, ...)
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
    n = json_int_field(line, sizeof line, n, "id", id);
    n = json_int_field(line, sizeof line, n, "handle", handle);
    n = json_int_field(line, sizeof line, n, "ep", ep);
    n = json_int_field(line, sizeof line, n, "length", length);
    n = json_int_field(line, sizeof line, n, "actual", actual);
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
void shim_warn(const char *call, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "coralrt usbshim (pid %d): %s: %s\n", (int)getpid(), call, text);
    shim_log(call, NONE, NONE, NONE, NONE, NONE, "LIBUSB_ERROR_IO", "%s", text);
}
