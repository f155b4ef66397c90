package main

import "golang.org/x/sys/unix"

// kernelFS returns the name of the kernel's file system that holds dir when it is one that holds
// no files of a program's (/proc, /sys and those mounted in them): a data directory cannot live
// there, though root may pass access(2)'s test of it.
func kernelFS(dir string) (string, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return "", false
	}
	name, ok := kernelFSNames[int64(st.Type)]
	return name, ok
}

var kernelFSNames = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "proc",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.DEVPTS_SUPER_MAGIC:  "devpts",
	unix.BPF_FS_MAGIC:        "bpf",
	unix.PSTOREFS_MAGIC:      "pstore",
	unix.EFIVARFS_MAGIC:      "efivarfs",
}
