"""WorkerService.Connect: the stream protocol (hello, attach, reads) and the result path (the
batch completer). May import dispatch and every package below it."""
