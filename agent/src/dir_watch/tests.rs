use std::time::Duration;

use super::*;

/// One inotify event as the kernel lays it out.
fn event(mask: u32, name: &str) -> Vec<u8> {
    let mut name = name.as_bytes().to_vec();
    name.resize(name.len().div_ceil(16) * 16, 0);
    let mut b = Vec::new();
    for v in [1u32, mask, 0, u32::try_from(name.len()).unwrap_or(0)] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    b.extend_from_slice(&name);
    b
}

#[test]
fn directories_made_or_removed_count_files_only_where_any_entry_does() {
    let dir = libc::IN_ISDIR;
    let d = Entries::Dirs;
    assert_eq!(
        events(&event(libc::IN_CREATE | dir, "pod1234"), d),
        Seen::Entries
    );
    assert_eq!(
        events(&event(libc::IN_DELETE | dir, "pod1234"), d),
        Seen::Entries
    );
    assert_eq!(events(&event(libc::IN_CREATE, "a-file"), d), Seen::Nothing);
    assert_eq!(events(&event(libc::IN_Q_OVERFLOW, ""), d), Seen::Entries);
    let mut two = event(libc::IN_CREATE, "a-file");
    two.extend(event(libc::IN_MOVED_TO | dir, "pod9"));
    assert_eq!(events(&two, d), Seen::Entries);
    assert_eq!(events(&event(libc::IN_DELETE_SELF, ""), d), Seen::Lost);
    assert_eq!(events(&event(libc::IN_IGNORED, ""), d), Seen::Lost);
    // A step's socket counts where any entry does.
    assert_eq!(
        events(&event(libc::IN_CREATE, "c1_42.0"), Entries::Any),
        Seen::Entries
    );
    assert_eq!(
        events(&event(libc::IN_DELETE, "c1_42.0"), Entries::Any),
        Seen::Entries
    );
    // A truncated header is not read past.
    assert_eq!(events(&[0; 7], d), Seen::Nothing);
}

#[tokio::test]
async fn a_directory_made_and_removed_wakes_the_watch() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let kubepods = dir.path().join("kubepods");
    std::fs::create_dir_all(kubepods.join("burstable"))?;
    let mut w = DirWatch::watch(
        &[kubepods.clone(), kubepods.join("burstable")],
        Entries::Dirs,
    )?;
    let wait = Duration::from_secs(5);
    // A file is no pod: nothing yet.
    std::fs::write(kubepods.join("cgroup.procs"), "")?;
    assert!(
        tokio::time::timeout(Duration::from_millis(100), w.changed())
            .await
            .is_err()
    );
    std::fs::create_dir(kubepods.join("burstable/pod-a"))?;
    assert!(
        tokio::time::timeout(wait, w.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    );
    std::fs::remove_dir(kubepods.join("burstable/pod-a"))?;
    assert!(
        tokio::time::timeout(wait, w.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    );
    // The watched directory itself going away loses the watch.
    std::fs::remove_dir(kubepods.join("burstable"))?;
    let lost = loop {
        match tokio::time::timeout(wait, w.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => break Some(e),
            Err(_) => break None,
        }
    };
    assert!(lost.is_some());
    // A directory that is not there cannot be watched.
    assert!(DirWatch::watch(&[dir.path().join("nothing")], Entries::Any).is_err());
    Ok(())
}

#[tokio::test]
async fn any_entry_counts_where_asked() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut w = DirWatch::watch(&[dir.path().to_path_buf()], Entries::Any)?;
    std::fs::write(dir.path().join("c1_42.0"), "")?;
    let wait = Duration::from_secs(5);
    assert!(
        tokio::time::timeout(wait, w.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    );
    std::fs::remove_file(dir.path().join("c1_42.0"))?;
    assert!(
        tokio::time::timeout(wait, w.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    );
    Ok(())
}
