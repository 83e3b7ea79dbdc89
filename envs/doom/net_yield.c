/* fastrl: preloaded into the ViZDoom engines of a network game (envs/doom/match.py).

   While an engine waits for another player's tic it spins on recvfrom over its
   non-blocking UDP socket, taking the core from the very engine it waits for when
   engines outnumber cores. After each empty call this yields the core and lets the
   engine spin on: it never waits longer, and a player with work runs sooner.
   (Sleeping in poll instead stalls the same loop that sends the engine's own tic.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/types.h>

typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from, socklen_t *fromlen) {
    static recvfrom_fn next;
    if (!next) {
        next = (recvfrom_fn)dlsym(RTLD_NEXT, "recvfrom");
    }
    ssize_t got = next(fd, buf, len, flags, from, fromlen);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        int empty = errno;
        sched_yield();
        errno = empty;
    }
    return got;
}
