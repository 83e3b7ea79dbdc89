/* fastrl: preloaded into the ViZDoom engines of a network game (envs/doom/match.py).

   While an engine waits for another player's tic it calls recvfrom on its
   non-blocking UDP socket again and again: 27 empty calls for each packet it sent,
   measured with strace. On a machine with fewer cores than engines that spinning
   takes the core from the very engine it waits for. After each empty call this
   gives the core away (sched_yield) and then lets the engine spin on: the engine
   never waits longer than it did, and a player with work to do runs sooner.
   (Sleeping in poll instead made games 4-6x slower: the same loop sends the
   engine's own tic, and every player then waited on every other.) */
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
