public import Foundation

/// A child process this process waits for itself (`waitpid`), started with every signal
/// unblocked and at its default action. Foundation's `Process` notices exits through SIGCHLD; a
/// parent that was itself started with signals blocked (a test runner, some supervisors) passes
/// that mask on, and `Process` can then miss an exit for good. The children of `banyan cluster
/// roll`'s restart command (the restarted nodes) inherit the clean mask too.
public enum ChildProcess {
    /// Starts `executable` with `arguments` (argv[0] is added) and `environment`; standard
    /// output and error go to `outputFile` (appended) when given, else to this process's.
    public static func spawn(_ executable: String, _ arguments: [String], environment: [String: String], outputFile: String? = nil) throws -> pid_t {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if let outputFile {
            posix_spawn_file_actions_addopen(&actions, 1, outputFile, O_WRONLY | O_CREAT | O_APPEND, 0o644)
            posix_spawn_file_actions_adddup2(&actions, 1, 2)
        }
        let words: [String] = [executable] + arguments
        let argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard result == 0 else { throw HTTPClientError("cannot start \(executable): \(String(cString: strerror(result)))") }
        return pid
    }

    /// How a child ended.
    public enum Ending: Sendable, Equatable {
        case exited(Int32)
        case signalled(Int32)
        /// Still running at the deadline: it was killed (SIGKILL) and reaped.
        case timedOut
    }

    /// Waits (polling every 20 ms) until `pid` ends or `seconds` pass.
    public static func wait(_ pid: pid_t, seconds: Double) -> Ending {
        let deadline = Date().addingTimeInterval(seconds)
        var status: Int32 = 0
        while true {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid { break }
            if reaped < 0, errno != EINTR { return .signalled(0) }
            if Date() >= deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                return .timedOut
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import.
        return status & 0x7f == 0 ? .exited((status >> 8) & 0xff) : .signalled(status & 0x7f)
    }
}
