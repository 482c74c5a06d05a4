// Package readme runs the command blocks of the repository's README.md, in
// order, against a real mount, as a newcomer would type them.
//
// Each fenced block is labelled with its language:
//
//   - sh: run as one bash script (set -euo pipefail) from the repository's
//     root; it must exit 0.
//   - console: a transcript. Each "$ " line runs in one shell session (a cd
//     holds for the lines after it); what it prints, stdout and stderr, must
//     be the lines that follow it, dates of ls -l aside. A line may fail only
//     where its expected output holds that program's error ("cp: …").
//   - python: run with python3; each print(…) line's trailing comment, up to
//     a colon, is the line it must print.
//   - text: not run (file contents such as an fstab line).
//
// An HTML comment right before a block changes what is done with it:
// "<!-- readme-test: skip (why) -->" skips it (a GPU, an NVMe namespace,
// systemd, the package index, a system-wide install: keep these few and the
// reason honest), "<!-- readme-test: background (…) -->" runs a
// long-running sh block (make run) in the background, waits until the mount
// answers, and interrupts it (Ctrl-C) at the end.
//
// The blocks run in a copy of the checkout (its tracked files and the
// untracked ones git does not ignore), as in a fresh clone. Paths are moved
// under a temporary directory: "/mnt/", "/var/lib/kvfs/",
// "/var/tmp/", "/tmp/" and "/backup" at the start of a word get its path
// as a prefix, and make run gets KVFS_STORE, KVFS_MOUNT and KVFS_SIZE
// (64MiB) to match. Python runs with the client installed by pip into a
// --target directory (PIP_TARGET, PYTHONPATH).
package readme

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// block is one fenced block of README.md.
type block struct {
	lang string
	line int    // of the opening fence, 1-based
	mark string // "skip", "background" or ""
	why  string // the marker's text
	text string
}

var markRe = regexp.MustCompile(`^<!-- readme-test: (skip|background)\b\s*(.*?)\s*-->$`)

// parse returns README's fenced blocks in order, with their markers. A
// marker must be followed by a block (blank lines between are allowed);
// a fence without a language is an error, so no command block goes unrun
// by mistake.
func parse(readme string) ([]block, error) {
	var out []block
	var cur *block
	var mark, why string
	markLine := 0
	sc := bufio.NewScanner(strings.NewReader(readme))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if cur != nil {
			if l == "```" {
				out = append(out, *cur)
				cur = nil
			} else {
				cur.text += l + "\n"
			}
			continue
		}
		if m := markRe.FindStringSubmatch(l); m != nil {
			mark, why, markLine = m[1], m[2], n
			continue
		}
		if lang, ok := strings.CutPrefix(l, "```"); ok {
			switch lang {
			case "sh", "console", "python", "text":
			default:
				return nil, fmt.Errorf("README.md:%d: a block labelled %q: label it sh, console, python or text", n, lang)
			}
			cur = &block{lang: lang, line: n, mark: mark, why: why}
			mark, why = "", ""
			continue
		}
		if mark != "" && strings.TrimSpace(l) != "" {
			return nil, fmt.Errorf("README.md:%d: the readme-test marker is not followed by a block", markLine)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("README.md:%d: the block is not closed", cur.line)
	}
	return out, nil
}

var pathRe = regexp.MustCompile(`(^|[\s'"=(])(/mnt/|/var/lib/kvfs/|/var/tmp/|/tmp/|/backup\b)`)

// rewrite moves the README's absolute paths under root.
func rewrite(s, root string) string {
	return pathRe.ReplaceAllString(s, "${1}"+root+"${2}")
}

func need(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the README is run as root (make run mounts with mount(2)); CI runs it as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipping: /dev/fuse is missing")
	}
	var missing []string
	for _, c := range []string{"bash", "make", "go", "rsync", "getfattr", "hexdump", "python3", "pip", "fio"} {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		t.Skipf("skipping: the README uses %s (scripts/deps.sh installs them)", strings.Join(missing, ", "))
	}
}

func TestReadme(t *testing.T) {
	need(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parse(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	repo = cloneRepo(t, repo, filepath.Join(root, "src"))
	for _, d := range []string{"mnt/kvcache", "var/lib/kvfs", "var/tmp", "tmp", "py"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(root, "mnt", "kvcache")
	env := append(os.Environ(), "PATH="+pythonPath(t),
		"KVFS_STORE="+filepath.Join(root, "var/lib/kvfs/default.kvfs"), "KVFS_MOUNT="+mnt, "KVFS_SIZE=64MiB",
		"PIP_TARGET="+filepath.Join(root, "py"), "PYTHONPATH="+filepath.Join(root, "py"),
		"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1", "PIP_NO_CACHE_DIR=1", "PIP_ROOT_USER_ACTION=ignore",
		"TMPDIR="+filepath.Join(root, "tmp"), "LC_ALL=C.UTF-8")
	r := &runner{t: t, repo: repo, root: root, env: env}
	defer r.stopBackground(mnt)
	ran := 0
	for _, b := range blocks {
		if b.lang == "text" {
			continue
		}
		if b.mark == "skip" {
			t.Logf("README.md:%d: skipped %s", b.line, b.why)
			continue
		}
		start := time.Now()
		switch {
		case b.mark == "background":
			r.background(b, mnt)
		case b.lang == "sh":
			r.sh(b)
		case b.lang == "console":
			r.console(b)
		case b.lang == "python":
			r.python(b)
		}
		t.Logf("README.md:%d: %s block ran in %v", b.line, b.lang, time.Since(start).Round(time.Millisecond))
		ran++
	}
	if ran < 8 {
		t.Fatalf("only %d blocks of README.md ran", ran)
	}
}

// cloneRepo copies the checkout's files (tracked, and untracked ones git
// does not ignore) into dir, as a fresh clone would hold them, and returns
// dir; without git it returns repo. The blocks then build bin/kvfs in the
// copy, where no other test (make install in integration/fuse) rebuilds it
// under them.
func cloneRepo(t *testing.T, repo, dir string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Logf("running the README in %s itself: git ls-files: %v", repo, err)
		return repo
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(repo, name)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the worktree, or a link or submodule
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// pythonPath is PATH, with /usr/bin first when the python3 there can
// build the client offline (setuptools and wheel, as Debian's
// python3-setuptools and python3-wheel provide; scripts/test-python.sh uses
// the same one) and the first python3 on PATH cannot.
func pythonPath(t *testing.T) string {
	path := os.Getenv("PATH")
	canBuild := func(py string) bool { return exec.Command(py, "-c", "import setuptools, wheel").Run() == nil }
	if py, err := exec.LookPath("python3"); err == nil && canBuild(py) {
		return path
	}
	if canBuild("/usr/bin/python3") {
		return "/usr/bin:" + path
	}
	t.Skip("skipping: no python3 with setuptools and wheel to install the client offline (scripts/deps.sh installs them)")
	return ""
}

type runner struct {
	t          *testing.T
	repo, root string
	env        []string
	bg         *exec.Cmd
	bgOut      *bytes.Buffer
	bgDone     chan error
}

func (r *runner) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	c.Dir = r.repo
	c.Env = r.env
	c.WaitDelay = 5 * time.Second
	return c
}

// sh runs an sh block as one script; it must exit 0.
func (r *runner) sh(b block) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := r.command(ctx, "bash", "-c", "set -euo pipefail\n"+rewrite(b.text, r.root))
	out, err := c.CombinedOutput()
	if err != nil {
		r.t.Fatalf("README.md:%d: the sh block failed (%v):\n%s\noutput:\n%s", b.line, err, b.text, out)
	}
}

// background starts a long-running sh block and waits until the mount at
// mnt answers.
func (r *runner) background(b block, mnt string) {
	r.t.Helper()
	c := r.command(context.Background(), "bash", "-c", rewrite(b.text, r.root))
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.bgOut = &bytes.Buffer{}
	c.Stdout, c.Stderr = r.bgOut, r.bgOut
	if err := c.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.bg, r.bgDone = c, make(chan error, 1)
	go func() { r.bgDone <- c.Wait() }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(mnt, ".kvfs", "geometry")); err == nil {
			return
		}
		select {
		case err := <-r.bgDone:
			r.bg = nil
			r.t.Fatalf("README.md:%d: the background block ended (%v) before %s was mounted:\n%s", b.line, err, mnt, r.bgOut)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("README.md:%d: %s not mounted after 3 minutes:\n%s", b.line, mnt, r.bgOut)
		}
	}
}

// stopBackground interrupts the background block as Ctrl-C in its terminal
// would (SIGINT to its process group): make dies of the signal, as it does
// on a terminal, and the daemon must unmount.
func (r *runner) stopBackground(mnt string) {
	if r.bg == nil {
		return
	}
	syscall.Kill(-r.bg.Process.Pid, syscall.SIGINT)
	select {
	case err := <-r.bgDone:
		var ee *exec.ExitError
		if err != nil && !(errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT) {
			r.t.Errorf("the background block after Ctrl-C: %v\n%s", err, r.bgOut)
		}
	case <-time.After(30 * time.Second):
		syscall.Kill(-r.bg.Process.Pid, syscall.SIGKILL)
		r.t.Errorf("the background block did not end within 30 s of Ctrl-C:\n%s", r.bgOut)
	}
	// kvfs mount is in the same process group and unmounts on SIGINT;
	// make does not wait for it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mounts, err := os.ReadFile("/proc/mounts")
		if err != nil || !bytes.Contains(mounts, []byte(" "+mnt+" ")) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Errorf("%s is still mounted 30 s after Ctrl-C:\n%s", mnt, r.bgOut)
			return
		}
	}
}

// step is one command of a console transcript and what it prints.
type step struct {
	cmd  string
	want []string
}

func transcript(text string) []step {
	var steps []step
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			steps = append(steps, step{cmd: c})
		} else if len(steps) > 0 {
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, l)
		}
	}
	return steps
}

var (
	lsDate  = regexp.MustCompile(`[A-Z][a-z]{2} [ 0-9]\d (\d\d:\d\d| \d{4})`)
	errLine = regexp.MustCompile(`^([A-Za-z0-9_.-]+): `)
)

func normalize(lines []string) string {
	s := strings.TrimRight(strings.Join(lines, "\n"), "\n ")
	return lsDate.ReplaceAllString(s, "DATE")
}

// console runs a transcript in one shell session and compares what each
// command prints with the lines that follow it.
func (r *runner) console(b block) {
	r.t.Helper()
	steps := transcript(b.text)
	outDir := r.t.TempDir()
	var script strings.Builder
	for i, s := range steps {
		fmt.Fprintf(&script, "{ %s\n} >%s/out.%d 2>&1 </dev/null; echo $? >%s/rc.%d\n", rewrite(s.cmd, r.root), outDir, i, outDir, i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := r.command(ctx, "bash", "-c", script.String()).CombinedOutput(); err != nil {
		r.t.Fatalf("README.md:%d: the transcript's shell failed (%v):\n%s", b.line, err, out)
	}
	for i, s := range steps {
		out, err := os.ReadFile(fmt.Sprintf("%s/out.%d", outDir, i))
		if err != nil {
			r.t.Fatalf("README.md:%d: $ %s did not run: %v", b.line, s.cmd, err)
		}
		rc, _ := os.ReadFile(fmt.Sprintf("%s/rc.%d", outDir, i))
		got := strings.ReplaceAll(string(out), r.root, "")
		if g, w := normalize(strings.Split(got, "\n")), normalize(s.want); g != w {
			r.t.Fatalf("README.md:%d: $ %s\nprints:\n%s\nthe README shows:\n%s", b.line, s.cmd, got, strings.Join(s.want, "\n"))
		}
		if strings.TrimSpace(string(rc)) != "0" && !mayFail(s) {
			r.t.Fatalf("README.md:%d: $ %s exits %s, and the README shows no error of it", b.line, s.cmd, strings.TrimSpace(string(rc)))
		}
	}
}

// mayFail: the expected output holds an error of a program the command runs.
func mayFail(s step) bool {
	for _, l := range s.want {
		if m := errLine.FindStringSubmatch(l); m != nil && strings.Contains(" "+s.cmd, " "+m[1]+" ") {
			return true
		}
	}
	return false
}

// python runs a python block; each print line's trailing comment, up to a
// colon, is the line it prints.
func (r *runner) python(b block) {
	r.t.Helper()
	var want []string
	for _, l := range strings.Split(b.text, "\n") {
		if code, comment, ok := strings.Cut(l, "#"); ok && strings.Contains(code, "print(") {
			w, _, _ := strings.Cut(strings.TrimSpace(comment), ":")
			want = append(want, strings.TrimSpace(w))
		}
	}
	f := filepath.Join(r.t.TempDir(), "readme.py")
	if err := os.WriteFile(f, []byte(rewrite(b.text, r.root)), 0o644); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := r.command(ctx, "python3", f)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		r.t.Fatalf("README.md:%d: the python block failed (%v):\n%s%s", b.line, err, out, stderr.String())
	}
	if got := strings.TrimRight(string(out), "\n"); got != strings.Join(want, "\n") {
		r.t.Fatalf("README.md:%d: the python block prints:\n%s\nits comments say:\n%s", b.line, got, strings.Join(want, "\n"))
	}
}
