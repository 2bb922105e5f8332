package dev.adaptiverag;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * One OpenSearch 2.19 node in this JVM, serving the real REST API on loopback.
 *
 * <p>Usage: {@code java -cp target/classes:target/lib/* dev.adaptiverag.LocalOpenSearch HTTP_PORT BASE_DIR
 * [KEY=VALUE | KEY[]=A,B ...]}
 *
 * <p>BASE_DIR gets {@code home/} (with empty {@code modules/} and {@code plugins/}: the plugins
 * are loaded from the classpath instead), {@code data/} and {@code logs/}. It is a development and
 * CI node: single-node discovery, no security plugin, loopback only, disk watermarks off. Settings
 * given after BASE_DIR replace these defaults ({@code KEY[]=A,B} sets a list), so the same node
 * joins a cluster: {@code discovery.type=zen}, {@code discovery.seed_hosts[]=...},
 * {@code cluster.initial_cluster_manager_nodes[]=...}, {@code node.roles[]=...} (see
 * {@code infra/local/opensearch.py}). SIGTERM (or Ctrl-C) closes the node cleanly.
 */
public final class LocalOpenSearch {

    /** Node's constructor that accepts classpath plugins is protected. */
    static final class EmbeddedNode extends Node {
        EmbeddedNode(Environment environment, Collection<Class<? extends Plugin>> plugins) {
            super(environment, plugins, true);
        }
    }

    private LocalOpenSearch() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: LocalOpenSearch HTTP_PORT BASE_DIR [KEY=VALUE | KEY[]=A,B ...]");
            System.exit(2);
        }
        int httpPort = Integer.parseInt(args[0]);
        Path base = Paths.get(args[1]).toAbsolutePath();

        Path home = base.resolve("home");
        Path data = base.resolve("data");
        Path logs = base.resolve("logs");
        for (Path p : List.of(home.resolve("modules"), home.resolve("plugins"), home.resolve("config"), data, logs)) {
            Files.createDirectories(p);
        }

        Settings.Builder builder = Settings.builder()
            .put("cluster.name", "adaptive-rag-local")
            .put("node.name", "local-" + httpPort)
            .put("path.home", home.toString())
            .put("path.data", data.toString())
            .put("path.logs", logs.toString())
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            .put("http.port", httpPort)
            // transport is internal only; let it pick a free port in its default range
            .put("transport.port", "9300-9400")
            .put("bootstrap.memory_lock", false)
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            // one node: new indices must not ask for replicas they can never get
            .put("cluster.default_number_of_replicas", 0)
            .put("action.destructive_requires_name", true)
            // root logger level for the console appender that configureWithoutConfig installs
            .put("logger.level", System.getProperty("local.opensearch.log.level", "INFO"));
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                System.err.println("not a KEY=VALUE setting: " + args[i]);
                System.exit(2);
            }
            String key = args[i].substring(0, eq);
            String value = args[i].substring(eq + 1);
            if (key.endsWith("[]")) {
                builder.putList(key.substring(0, key.length() - 2), List.of(value.split(",")));
            } else {
                builder.put(key, value);
            }
        }
        Settings settings = builder.build();
        String nodeName = settings.get("node.name");

        LogConfigurator.registerErrorListener();
        LogConfigurator.configureWithoutConfig(settings);

        Environment env = InternalSettingsPreparer.prepareEnvironment(
            settings, Map.of(), home.resolve("config"), () -> nodeName);

        long t0 = System.nanoTime();
        Node node = new EmbeddedNode(env, List.of(Netty4Plugin.class, CommonAnalysisPlugin.class));
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                stopped.countDown();
            }
        }, "local-opensearch-shutdown"));
        node.start();
        System.out.printf("LocalOpenSearch %s started on http://127.0.0.1:%d in %d ms (data %s)%n",
            nodeName, httpPort, TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0), data);
        System.out.flush();
        stopped.await();
    }
}
