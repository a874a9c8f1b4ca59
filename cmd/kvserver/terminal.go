package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// foregroundEnv, set to 1 (`make run` does), makes kvserver take its
// terminal's foreground for itself alone (takeTerminal).
const foregroundEnv = "KVSERVER_FOREGROUND"

// takeTerminal puts this process in a process group of its own and makes
// that group its controlling terminal's foreground, so that Ctrl-C sends
// SIGINT to kvserver only, not to the program that started it. Under
// `make run`, make got the SIGINT too and, whatever its recipe did, died
// of it once kvserver had stopped: the shell said exit status 130 for a
// clean stop. It does nothing without a controlling terminal, or when this
// process's group is not the terminal's foreground (a background job) or
// is its own already (a shell's job).
//
// Ctrl-Z (SIGTSTP, which now reaches kvserver alone) gives the terminal
// back and stops the whole job kvserver came from, so that the shell sees
// its job stopped; continued in the foreground (fg), kvserver takes the
// terminal again. restore gives the terminal back for good.
func takeTerminal() (restore func()) {
	noop := func() {}
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return noop // no controlling terminal
	}
	fd := int(tty.Fd())
	job := unix.Getpgrp()
	if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err != nil || fg != job || unix.Getpid() == job {
		tty.Close()
		return noop
	}
	// Setting the foreground from a group that is not the foreground
	// stops the process with SIGTTOU unless it is ignored.
	signal.Ignore(syscall.SIGTTOU)
	take := func() bool {
		if err := unix.Setpgid(0, 0); err != nil {
			return false
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, unix.Getpid()); err != nil {
			unix.Setpgid(0, job)
			return false
		}
		return true
	}
	giveBack := func() {
		if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && fg == unix.Getpgrp() {
			unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, job)
		}
		unix.Setpgid(0, job)
	}
	if !take() {
		tty.Close()
		return noop
	}
	var mu sync.Mutex
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTSTP, syscall.SIGCONT)
	go func() {
		for sig := range sigs {
			mu.Lock()
			switch sig {
			case syscall.SIGTSTP:
				giveBack()
				unix.Kill(-job, unix.SIGSTOP) // kvserver too: it is back in the job
			case syscall.SIGCONT:
				if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && fg == job && unix.Getpgrp() == job {
					take() // fg, not bg
				}
			}
			mu.Unlock()
		}
	}()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		signal.Stop(sigs)
		close(sigs)
		giveBack()
		tty.Close()
	}
}
