"""What happens to a task from outside: submit (admission, overload), control (get, cancel, retry,
explain), waiting for an end, and schedules turned into tasks. May import dispatch and every
package below it (not workers)."""
