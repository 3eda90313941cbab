// A terminal chat room with presence, over Banyan's Swift SDK (the Firebase iOS database API).
//
//   swift run banyan-chat --url 'http://127.0.0.1:9000?ns=chat' --name ada
//
// Data (one tree per room):
//   rooms/<room>/messages/<push id>               {name, text, at}   at: the server's timestamp
//   rooms/<room>/members/<name>/connections/<id>  one entry per running chat of that name, removed
//                                                 by the server when that chat's connection ends
//   rooms/<room>/members/<name>/lastOnline        set by the server when a connection ends
//
// It shows the last 50 messages and then new ones as they come (childAdded on a toLast query),
// sends each line typed (childByAutoId with ServerValue.timestamp()), keeps a presence list with
// Firebase's recipe (.info/connected plus onDisconnect), and works offline: with persistence on
// (the default) the room's messages and any unsent ones are kept on disk, shown at the next start
// and sent once the server can be reached.

ChatProgram.run()
