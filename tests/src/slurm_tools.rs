//! Wrapper scripts for the Slurm client tools a component runs by name (`SlurmArgs::slurm_bin_dir` points at their
//! directory): each logs its call (time, program, arguments) and runs the real program — unless a fault is armed
//! for it: the next answers empty (as a `squeue` that lost its jobs would print), or the real program's work done
//! and then no answer (as an `sbatch` whose reply is lost past its timeout). A `--version` query (the controller
//! reads the Slurm release) reaches the real program unlogged and unfaulted: it reads and changes nothing.

use std::path::Path;
use std::time::SystemTime;

use crate::slurm_release::SlurmRelease;

/// One logged call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Unix time, seconds.
    pub at: f64,
    /// `squeue`, `sbatch`, …
    pub program: String,
    /// Its arguments, space-separated (`EMPTY` / `HUNG` for an armed fault's call).
    pub args: String,
}

impl Call {
    /// When it was made.
    pub fn time(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(self.at.max(0.0))
    }
}

/// The directory of wrappers; removed when dropped.
#[derive(Debug)]
pub struct Tools {
    dir: tempfile::TempDir,
}

impl Tools {
    /// Wrappers for `programs` of Slurm 22.05 (found on `PATH`).
    pub fn new(programs: &[&str]) -> Tools {
        Self::for_release(SlurmRelease::V22_05, programs)
    }

    /// Wrappers for `programs` of `release` (and its `setpriv`, for a controller that switches user with it: a call
    /// `setpriv … <dir>/sbatch ARGS` is logged and faulted as sbatch's).
    pub fn for_release(release: SlurmRelease, programs: &[&str]) -> Tools {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        write_setpriv(
            dir.path(),
            &release.program("setpriv"),
            release.bin_dir().is_none(),
        );
        for &program in programs {
            let real = release.program(program);
            let script = format!(
                "#!/bin/sh\n\
                 d='{d}'\n\
                 if [ \"$*\" = --version ]; then exec '{real}' --version; fi\n\
                 log() {{ printf '%s %s %s\\n' \"$(date +%s.%N)\" {program} \"$1\" >> \"$d/calls.log\"; }}\n\
                 log \"$*\"\n\
                 if [ -s \"$d/{program}.empty\" ]; then\n\
                   n=$(cat \"$d/{program}.empty\")\n\
                   if [ \"$n\" -gt 0 ]; then echo $((n - 1)) > \"$d/{program}.empty\"; log EMPTY; exit 0; fi\n\
                 fi\n\
                 if [ -e \"$d/{program}.hang\" ]; then\n\
                   rm -f \"$d/{program}.hang\"; '{real}' \"$@\"; log HUNG; exec sleep 60\n\
                 fi\n\
                 exec '{real}' \"$@\"\n",
                real = real.display()
            );
            write_executable(&dir.path().join(program), &script);
        }
        Tools { dir }
    }

    /// The directory (for `slurm_bin_dir`).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        std::fs::read_to_string(self.dir.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ' ');
                Some(Call {
                    at: f.next()?.parse().ok()?,
                    program: f.next()?.to_owned(),
                    args: f.next().unwrap_or("").to_owned(),
                })
            })
            .collect()
    }

    /// The calls of `program` so far.
    pub fn calls_of(&self, program: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.program == program)
            .collect()
    }

    /// Wait (up to `within`) until `program` has been called `n` more times than now: for a loop that calls it once
    /// per pass, every pass begun before the wait has then ended. Panics, naming `what`, if it is not called so often.
    pub fn await_more_calls(
        &self,
        program: &str,
        n: usize,
        within: std::time::Duration,
        what: &str,
    ) {
        let before = self.calls_of(program).len();
        crate::slurm::wait_until(what, within, || self.calls_of(program).len() >= before + n);
    }

    /// The next `n` calls of `program` answer nothing (exit 0, no output).
    pub fn answer_empty(&self, program: &str, n: u32) {
        std::fs::write(
            self.dir.path().join(format!("{program}.empty")),
            n.to_string(),
        )
        .unwrap();
    }

    /// The next call of `program` runs the real program and then does not end (until killed, or 60 s).
    pub fn hang_after_next(&self, program: &str) {
        std::fs::write(self.dir.path().join(format!("{program}.hang")), "").unwrap();
    }
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `setpriv OPTIONS PROGRAM ARGS` in `d`: logged as a call of PROGRAM (its name, its arguments) and subject to
/// PROGRAM's armed faults, as if the controller had run PROGRAM's wrapper, then run through the release's `setpriv`
/// (`real`), which runs PROGRAM of the release as the user. `on_path`: the release's programs are the machine's,
/// and PROGRAM is run by its name from `PATH` (the user cannot enter the wrappers' private directory); a release
/// in a root maps `<d>/PROGRAM` to its own PROGRAM itself.
fn write_setpriv(d: &Path, real: &Path, on_path: bool) {
    let script = format!(
        "#!/bin/sh\n\
         d='{d}'\n\
         log() {{ printf '%s %s %s\\n' \"$(date +%s.%N)\" \"$p\" \"$1\" >> \"$d/calls.log\"; }}\n\
         p=; rest=\n\
         for a in \"$@\"; do\n\
           if [ -z \"$p\" ]; then case \"$a\" in -*) ;; *) p=${{a##*/}} ;; esac\n\
           else rest=\"$rest${{rest:+ }}$a\"; fi\n\
         done\n\
         log \"$rest\"\n\
         if [ -n '{on_path}' ]; then\n\
           seen=\n\
           for a in \"$@\"; do\n\
             shift\n\
             if [ -z \"$seen\" ]; then case \"$a\" in -*) ;; *) seen=1; a=${{a##*/}} ;; esac; fi\n\
             set -- \"$@\" \"$a\"\n\
           done\n\
         fi\n\
         if [ -s \"$d/$p.empty\" ]; then\n\
           n=$(cat \"$d/$p.empty\")\n\
           if [ \"$n\" -gt 0 ]; then echo $((n - 1)) > \"$d/$p.empty\"; log EMPTY; exit 0; fi\n\
         fi\n\
         if [ -e \"$d/$p.hang\" ]; then\n\
           rm -f \"$d/$p.hang\"; '{real}' \"$@\"; log HUNG; exec sleep 60\n\
         fi\n\
         exec '{real}' \"$@\"\n",
        d = d.display(),
        real = real.display(),
        on_path = if on_path { "1" } else { "" },
    );
    write_executable(&d.join("setpriv"), &script);
}
