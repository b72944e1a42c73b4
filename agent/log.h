/*
 * log.h: one-line structured logs on stderr, logfmt or JSON.
 *
 * log_msg(LOG_INFO, "session.open", "pid=%d uid=%u", pid, uid): the event name, then
 * key=value pairs in logfmt (quote values that hold spaces: name=\"%s\"; values from
 * outside through LOG_Q, below). The JSON
 * form is derived from the same pairs. Thread-safe: one write(2) per line.
 */
#ifndef AGENT_LOG_H
#define AGENT_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };
enum log_format { LOG_LOGFMT = 0, LOG_JSON };

void log_setup(enum log_level level, enum log_format format);
int log_enabled(enum log_level level);
void log_msg(enum log_level level, const char *event, const char *kvfmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_DEBUG_ON() log_enabled(LOG_DEBUG)

/*
 * Values that come from outside (a client's name, a pod name or a reason in a peer's
 * frame) go in quotes through LOG_Q: name=\"%s\" with LOG_Q(name). It escapes quotes and
 * backslashes (\" \\) and writes bytes below 0x20 and 0x7f as \xHH, so a value can end
 * neither its quotes nor its line. log_msg also writes every control byte of a line as
 * \xHH, whatever the caller forgot: one line per log_msg, always. The escaped copy lives
 * in a compound literal of the calling block (LOG_Q_MAX bytes; longer values are cut).
 */
#define LOG_Q_MAX 512
const char *log_q(char *buf, unsigned cap, const char *s);
#define LOG_Q(s) log_q((char[LOG_Q_MAX]){0}, LOG_Q_MAX, (s))

/*
 * Rate limit for lines a hostile peer or client can cause: at most LOG_LIMIT_BURST lines
 * per second per limiter; the lines dropped are counted and the next line that passes
 * reports how many (suppressed=N). A limiter belongs to one thread.
 */
#define LOG_LIMIT_BURST 10
struct log_limit {
    long long window_ns; /* start of the current one-second window */
    int lines;           /* printed in it */
    unsigned long long dropped;
};
/* 1 when a line may be printed now (*dropped: lines suppressed since the last one). */
int log_limit_pass(struct log_limit *l, unsigned long long *dropped);

#endif
