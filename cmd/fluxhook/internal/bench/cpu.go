package bench

// CPU accounting for `fluxhook bench`: the machine's busy time and each participant's share,
// from /proc, so that the report can say what PostgreSQL spent per event and how much of the
// machine other programs took while a workload ran (the budget assumes a quiet machine).

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux Go supports.
const clockTicks = 100

// cpuSnapshot is CPU time in clock ticks at one moment.
type cpuSnapshot struct {
	machineBusy, machineTotal int64 // all CPUs, from /proc/stat
	bench, consumer           int64
	dispatcher                int64
	postgres                  int64 // the throwaway cluster: postmaster, its children, reaped children
	postgresOK                bool
}

// cpuShares is a workload's CPU use, as a fraction of one CPU over its wall time.
type cpuShares struct {
	Seconds    float64  `json:"seconds"`
	Machine    float64  `json:"machine_cpus_busy"` // out of NumCPU
	Dispatcher float64  `json:"dispatcher_cpus"`
	Consumer   float64  `json:"consumer_cpus"`
	Bench      float64  `json:"producer_and_bench_cpus"`
	Postgres   *float64 `json:"postgres_cpus,omitempty"` // throwaway cluster only
	// Other is the rest of the machine: other programs (and PostgreSQL when it is not ours).
	Other float64 `json:"other_cpus"`
}

func (b *bench) cpuSnapshot(dispatcherPID int) cpuSnapshot {
	var s cpuSnapshot
	s.machineBusy, s.machineTotal = machineTicks()
	// With its reaped children: a baseline's producer runs in a process of its own, started and
	// waited for by the bench within the measured part.
	s.bench, _ = procTicks(os.Getpid(), true)
	if b.consumer != nil {
		s.consumer, _ = procTicks(b.consumer.pid(), false)
	}
	if dispatcherPID > 0 {
		s.dispatcher, _ = procTicks(dispatcherPID, false)
	}
	if b.db != nil && b.db.cluster != nil {
		s.postgres, s.postgresOK = clusterTicks(b.db.cluster.Dir())
	}
	return s
}

// shares turns two snapshots wallSeconds apart into CPUs used.
func shares(a, z cpuSnapshot, wallSeconds float64) cpuShares {
	if wallSeconds <= 0 {
		return cpuShares{}
	}
	cpus := func(ticks int64) float64 { return float64(ticks) / clockTicks / wallSeconds }
	s := cpuShares{
		Seconds:    wallSeconds,
		Machine:    cpus(z.machineBusy - a.machineBusy),
		Dispatcher: cpus(z.dispatcher - a.dispatcher),
		Consumer:   cpus(z.consumer - a.consumer),
		Bench:      cpus(z.bench - a.bench),
	}
	ours := s.Dispatcher + s.Consumer + s.Bench
	if a.postgresOK && z.postgresOK {
		pg := cpus(z.postgres - a.postgres)
		s.Postgres = &pg
		ours += pg
	}
	s.Other = max(s.Machine-ours, 0)
	return s
}

// machineTicks returns the busy and total ticks of all CPUs (the first line of /proc/stat).
func machineTicks() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	// user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
	// counted in user.
	for i, v := range f[1:] {
		if i >= 8 {
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// procTicks is a process's utime+stime, plus its reaped children's when withChildren.
func procTicks(pid int, withChildren bool) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, f, err := statFields(b)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	fields := []int{11, 12} // utime, stime (fields 14, 15)
	if withChildren {
		fields = append(fields, 13, 14) // cutime, cstime
	}
	var sum int64
	for _, i := range fields {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		sum += n
	}
	return sum, nil
}

// statFields splits /proc/PID/stat after the command name: f[0] is field 3 (state), f[1] the
// parent pid, f[11] utime.
func statFields(b []byte) (comm string, f []string, err error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", nil, fmt.Errorf("unexpected format")
	}
	f = strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return "", nil, fmt.Errorf("unexpected format")
	}
	return string(b[open+1 : end]), f, nil
}

// clusterTicks is the CPU time of a throwaway cluster: the postmaster with its reaped children,
// plus its live children (backends, background workers).
func clusterTicks(dir string) (int64, bool) {
	raw, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, false
	}
	total, err := procTicks(postmaster, true)
	if err != nil {
		return 0, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	parent := strconv.Itoa(postmaster)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile: counted in the postmaster's reaped children
		}
		_, f, err := statFields(b)
		if err != nil || f[1] != parent {
			continue
		}
		if n, err := procTicks(pid, false); err == nil {
			total += n
		}
	}
	return total, true
}
