/* The pod sandbox's only process: it holds the pod's namespaces open, reaps the
 * zombies of a shared PID namespace, and exits 0 on SIGINT/SIGTERM. Built static by
 * nodeimages.py so the image needs nothing else. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        puts("rlscale-pause 1");
        return 0;
    }
    struct sigaction sa = {0};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = leave;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;)
        pause();
}
