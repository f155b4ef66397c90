package sqlite

import "golang.org/x/sys/unix"

// freeBytes returns the bytes free to this process's user on the file system that holds dir
// (statfs's f_bavail: without the blocks a file system keeps for root), and false when it
// cannot be read.
func freeBytes(dir string) (uint64, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0, false
	}
	return st.Bavail * uint64(st.Bsize), true
}

// device returns the device of the file system that holds dir (stat's st_dev), and false when
// it cannot be read.
func device(dir string) (uint64, bool) {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return 0, false
	}
	return st.Dev, true
}
