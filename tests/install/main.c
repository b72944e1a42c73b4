/* Links against the installed libcoll: prints its version and an error string. */
#include <coll/coll.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    coll_conn *c;
    /* no agent listens there: a clean COLL_ERR_CONNECT, never a crash or a hang */
    coll_err e = coll_connect(&c, "/nonexistent/coll.sock", 1000);
    printf("libcoll %s: %s\n", coll_version(), coll_strerror(e));
    return e == COLL_ERR_CONNECT && strstr(coll_last_error(), "/nonexistent") ? 0 : 1;
}
