/*
 * test_log.c: the logger (agent/log.c): one line per call whatever the values hold,
 * values from outside escaped (LOG_Q), in logfmt and in JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "log.h"

/* Run log_msg calls with stderr in a file; return what they wrote. */
static char *capture(void (*fn)(void))
{
    static char out[8192];
    char path[128];
    tmp_path(path, sizeof(path), "log", 0);
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    assert_non_null(f);
    dup2(fileno(f), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    unlink(path);
    return out;
}

static int lines_of(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Found at 242e584: a client's name in HELLO (or a pod name in JOIN) holding a newline
 * and a quote wrote a whole forged line, "level=error event=agent.stopped". */
static const char forged[] = "app\" level=error event=agent.stopped\nts=x level=error "
                             "event=agent.stopped \\ \x01";

static void log_forged(void)
{
    log_msg(LOG_INFO, "session.ready", "session=1 client=\"%s\" gpu=no", LOG_Q(forged));
    log_msg(LOG_INFO, "session.ready", "session=2 client=\"%s\"", forged); /* LOG_Q forgotten */
}

static void values_from_outside_neither_end_their_quotes_nor_their_line(void **state)
{
    (void)state;
    log_setup(LOG_INFO, LOG_LOGFMT);
    const char *out = capture(log_forged);
    assert_int_equal(lines_of(out), 2);
    const char *first = strstr(out, "session=1 ");
    assert_non_null(first);
    /* the value keeps its quotes: the forged pairs stay inside them, escaped */
    assert_non_null(strstr(first, "client=\"app\\\" level=error event=agent.stopped\\x0ats=x"));
    assert_non_null(strstr(first, "\\\\ \\x01\" gpu=no\n"));
    /* without LOG_Q the line is still one line: the control bytes are written out */
    const char *second = strstr(out, "session=2 ");
    assert_non_null(second);
    assert_non_null(strstr(second, "\\x0ats=x"));
    assert_null(strstr(out, "\nts=x"));
}

static void log_forged_quoted(void)
{
    log_msg(LOG_INFO, "session.ready", "session=1 client=\"%s\" gpu=no", LOG_Q(forged));
}

static void json_lines_stay_one_object(void **state)
{
    (void)state;
    log_setup(LOG_INFO, LOG_JSON);
    const char *out = capture(log_forged_quoted);
    log_setup(LOG_INFO, LOG_LOGFMT);
    assert_int_equal(lines_of(out), 1);
    /* the escaped quote stays in the value: the client key holds the whole name */
    assert_non_null(strstr(out, "\"client\":\"app\\\\\\\" level=error"));
    assert_null(strstr(out, "\"event\":\"agent.stopped\""));
}

static void log_q_cuts_long_values(void **state)
{
    (void)state;
    char big[2000];
    memset(big, '"', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    const char *q = LOG_Q(big);
    assert_true(strlen(q) < LOG_Q_MAX);
    assert_int_equal(strlen(q) % 2, 0); /* whole escapes only: \" pairs */
    assert_string_equal(LOG_Q(NULL), "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(values_from_outside_neither_end_their_quotes_nor_their_line),
        cmocka_unit_test(json_lines_stay_one_object),
        cmocka_unit_test(log_q_cuts_long_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
