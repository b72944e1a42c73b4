/*
 * log.c: the structured logger. Lines are assembled in a stack buffer and written
 * with one write(2) so concurrent lines never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum log_level min_level = LOG_INFO;
static enum log_format out_format = LOG_LOGFMT;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_setup(enum log_level level, enum log_format format)
{
    min_level = level;
    out_format = format;
}

int log_enabled(enum log_level level)
{
    return level >= min_level;
}

int log_limit_pass(struct log_limit *l, unsigned long long *dropped)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long now = (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
    if (now - l->window_ns >= 1000000000LL) {
        l->window_ns = now;
        l->lines = 0;
    }
    if (l->lines >= LOG_LIMIT_BURST) {
        l->dropped++;
        return 0;
    }
    l->lines++;
    *dropped = l->dropped;
    l->dropped = 0;
    return 1;
}

/* s into buf (cap bytes) with every control byte as \xHH, and with quotes too (a value's
 * own: \" and \\). Whole escapes only: a long value is cut before one that does not fit. */
static size_t escape(char *buf, size_t cap, const char *s, int quotes)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    for (; s && *s && n + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (quotes && (c == '"' || c == '\\')) {
            buf[n++] = '\\';
            buf[n++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[c >> 4];
            buf[n++] = hex[c & 15];
        } else {
            buf[n++] = (char)c;
        }
    }
    buf[n] = '\0';
    return n;
}

const char *log_q(char *buf, unsigned cap, const char *s)
{
    escape(buf, cap, s, 1);
    return buf;
}

struct line {
    char buf[2048];
    size_t n;
};

static void put(struct line *l, const char *s, size_t len)
{
    if (l->n + len >= sizeof(l->buf) - 2) len = sizeof(l->buf) - 2 - l->n;
    memcpy(l->buf + l->n, s, len);
    l->n += len;
}

static void puts_(struct line *l, const char *s)
{
    put(l, s, strlen(s));
}

/* JSON string body of s[0..len) (without quotes). */
static void put_json_escaped(struct line *l, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(l, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(l, esc, 6);
        } else {
            put(l, (const char *)&s[i], 1);
        }
    }
}

/* Turn logfmt pairs (k=v k="v w") into JSON members. */
static void put_kv_json(struct line *l, const char *kv)
{
    const char *p = kv;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p) break;
        const char *k = p;
        while (*p && *p != '=' && *p != ' ')
            p++;
        size_t klen = (size_t)(p - k);
        const char *v = "";
        size_t vlen = 0;
        if (*p == '=') {
            p++;
            if (*p == '"') {
                p++;
                v = p;
                while (*p && !(*p == '"' && p[-1] != '\\'))
                    p++;
                vlen = (size_t)(p - v);
                if (*p == '"') p++;
            } else {
                v = p;
                while (*p && *p != ' ')
                    p++;
                vlen = (size_t)(p - v);
            }
        }
        puts_(l, ",\"");
        put_json_escaped(l, k, klen);
        puts_(l, "\":\"");
        put_json_escaped(l, v, vlen);
        puts_(l, "\"");
    }
}

void log_msg(enum log_level level, const char *event, const char *kvfmt, ...)
{
    if (level < min_level) return;
    char raw[1536], kv[1536];
    raw[0] = '\0';
    if (kvfmt) {
        va_list ap;
        va_start(ap, kvfmt);
        vsnprintf(raw, sizeof(raw), kvfmt, ap);
        va_end(ap);
    }
    escape(kv, sizeof(kv), raw, 0); /* a line is one line, whatever its values hold */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tbuf[64];
    snprintf(tbuf, sizeof(tbuf), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000);
    struct line l = {.n = 0};
    if (out_format == LOG_JSON) {
        puts_(&l, "{\"ts\":\"");
        puts_(&l, tbuf);
        puts_(&l, "\",\"level\":\"");
        puts_(&l, level_names[level]);
        puts_(&l, "\",\"event\":\"");
        put_json_escaped(&l, event, strlen(event));
        puts_(&l, "\"");
        put_kv_json(&l, kv);
        puts_(&l, "}");
    } else {
        puts_(&l, "ts=");
        puts_(&l, tbuf);
        puts_(&l, " level=");
        puts_(&l, level_names[level]);
        puts_(&l, " event=");
        puts_(&l, event);
        if (kv[0]) {
            puts_(&l, " ");
            puts_(&l, kv);
        }
    }
    l.buf[l.n++] = '\n';
    ssize_t w = write(STDERR_FILENO, l.buf, l.n);
    (void)w;
}
