// Names of the shared-memory segments in /dev/shm, and the removal of those whose creator died.
//
// A segment's name says which process created it: /chorus-<tag>-<rank>-n<pid namespace>-p<pid>.
// A segment exists under its name only from its creation until every rank of its communicator has
// mapped it; a rank killed in between (or a whole job killed during initialisation) would leave it
// behind. Whoever creates shared memory next on the machine (every new communicator), chorusrun
// when its ranks have exited, and a rank whose shared-memory set-up fails remove the segments of
// creators that are gone. Only libc: chorusrun compiles this file too.
#pragma once

#include <string>

namespace chorus::transport {

/// The name of rank `rank`'s segment of the communicator tagged `tag`, created by this process.
std::string segmentName(const std::string& tag, int rank);

/// Removes every /dev/shm/chorus-* segment whose creating process, in this process's pid namespace,
/// has exited (or is a zombie). Returns how many it removed. Never throws.
int removeOrphanSegments();

/// True if process `pid` has exited or is a zombie (false if it runs, or if that cannot be told).
bool processGone(int pid);

}  // namespace chorus::transport
