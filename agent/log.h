/*
 * log.h: one-line structured logs on stderr, logfmt or JSON.
 *
 * log_msg(LOG_INFO, "session.open", "pid=%d uid=%u", pid, uid): the event name, then
 * key=value pairs in logfmt (quote values that hold spaces: name=\"%s\"). The JSON
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

#endif
