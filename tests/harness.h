/*
 * harness.h: what the tests share: starting a real coll-agent process on a private
 * socket with a config written on the fly, stopping it with a deadline, reading its
 * log, and running child processes that report back through their exit status.
 */
#ifndef TESTS_HARNESS_H
#define TESTS_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cmocka.h>

struct agent {
    pid_t pid;
    char sock[108];
    char cfg[256];
    char log[256];
};

/* Write a config (the agent section gets socket, mode 0666 and debug-free logging
 * plus agent_extra lines; then body, e.g. a groups list) and start coll-agent on it.
 * Waits until the socket accepts (10 s at most). Returns 0 or -1. */
int agent_start(struct agent *a, const char *agent_extra, const char *body);
/* Start an agent with argv (NULL: --config a->cfg) on a->sock, logging to a->log, and
 * wait until its socket accepts (30 s at most; at once if it exits). On failure prints
 * why and the log's first lines, and returns -1. */
int agent_spawn(struct agent *a, char *const argv[]);
/* A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous address). */
int free_port(void);
/* A config body's lines that serve the endpoints on 127.0.0.1 at a free port other than
 * port (a rendezvous port taken a moment ago) into extra; returns that port. */
int http_extra(char *extra, size_t cap, int port);
/* GET url with curl into file; the HTTP status, or -1. */
int http_get(const char *url, const char *file);
/* GET /metrics of the endpoints at 127.0.0.1:hport into file, a text the agent
 * published after this call began (the agent publishes about once a second: the first
 * text's coll_up_seconds, then until another one is served); 200, or -1 after ms. */
int metrics_fresh(int hport, const char *file, int ms);
/* Whether file holds needle (its first 64 KiB). */
int file_has(const char *file, const char *needle);
/* Parse a /metrics text in file with tests/http/check_metrics.py (the Prometheus
 * client's parser) into out ("name value" lines). Its exit status: 0, 77 when the
 * parser is missing (it says so in out), else the text is invalid. */
int metrics_parse(const char *file, char *out, size_t cap);
/* The value metrics_parse printed for key, or -1. */
long metric_of(const char *out, const char *key);
/* SIGTERM, then wait up to 10 s (SIGKILL after). Returns the exit status, or -1 if
 * it had to be killed or died of a signal. */
int agent_stop(struct agent *a);
/* How many lines of the agent's log hold needle. */
int agent_log_count(const struct agent *a, const char *needle);
/* The number after " key=" on the last line of the agent's log that holds event, or -1
 * (e.g. "agent.stopped", "spun"). */
long agent_log_number(const struct agent *a, const char *event, const char *key);
/* Wait up to ms for agent_log_count(a, needle) >= n. Returns 1 if reached. */
int agent_log_wait(const struct agent *a, const char *needle, int n, int ms);

/* Fork; the child runs fn(arg) and exits with its return value. */
pid_t child_run(int (*fn)(void *), void *arg);
/* Wait for a child up to ms (SIGKILL after). Returns its exit status, or 128+signal. */
int child_wait(pid_t pid, int ms);

/* The number after "key:" in /proc/PID/task/TID/status (tid 0: /proc/PID/status, which
 * speaks for the main thread, and of memory for the process), or -1. */
long proc_status(pid_t pid, pid_t tid, const char *key);

/* Bind the calling thread (and what it starts from now on) to cpu. Returns 0 or -1. */
int pin_to_cpu(int cpu);

/* Unique path under /tmp for this process (n distinguishes several). */
void tmp_path(char *out, size_t cap, const char *what, int n);
double now_ms(void);

/* The heartbeat of agents that tests start across pods. Under a sanitizer, 4 times as long: on a
 * 2-CPU VM whose page faults are dear, ThreadSanitizer's shadow of a 2.5 MiB all-to-all's fresh
 * buffers made one op's local copies last 0.66-0.83 s, past 3 intervals of 250 ms, and the pods
 * that waited on it called it silent. Those copies now give the heartbeats turns (tcp.c:
 * TCP_TURN_BYTES); the margin stays for whatever else a sanitizer slows. Tests that
 * measure how soon silence is noticed set their own (test_seal's opcheck under
 * ThreadSanitizer and a loaded CPU once called a pod silent at 250 ms). */
#ifdef COLL_TEST_SANITIZED
#define TEST_HB_MS 1000
#else
#define TEST_HB_MS 250
#endif

#endif
